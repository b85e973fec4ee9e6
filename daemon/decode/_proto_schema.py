"""Protobuf writer schemas from the schema registry, compiled at run time.

A registry holds a Protobuf schema as ``.proto`` text (Confluent's registry, Java
serializers) or as a base64 ``FileDescriptorProto`` (what Confluent's Python and Go
serializers register, kept as it is by Apicurio Registry), with the files it imports
as references (subject and version), which may import others. protoc, the language's
own compiler (run from grpcio-tools in a child process, with a timeout, so that its
errors come back as text and a crash costs only the lookup), compiles the text and
the descriptors together into one ``FileDescriptorSet``; the well-known types
(``google/protobuf/*.proto``) come with it, never from the registry. Each schema id
gets a descriptor pool of its own: two versions of a subject define the same
message names.
"""

from __future__ import annotations

import base64
import binascii
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError

from icespool.decode._registry import Reference, RegistryAnswer, SchemaRegistry, SchemaUnavailable

__all__ = ["ProtoSchema", "compile_files", "parse_proto_schema"]

#: Files one schema may pull in through its references (transitively).
_MAX_FILES: Final = 256
_COMPILE_TIMEOUT: Final = 30.0
_WELL_KNOWN: Final = "google/protobuf/"
_INCLUDE: Final = str(Path(grpc_tools.__file__).parent / "_proto")
_BASE64: Final = re.compile(r"[A-Za-z0-9+/=\s]+")
#: The main schema's file name when the registry gives it none (its text).
_MAIN: Final = "icespool-schema.proto"


@dataclass(frozen=True)
class ProtoSchema:
    """One registry schema: its file's messages, looked up by the wire format's
    message-index path ([0] the first top-level message, [1, 0] the first nested
    message of the second)."""

    label: str
    file: descriptor_pb2.FileDescriptorProto
    pool: descriptor_pool.DescriptorPool
    _classes: dict[tuple[int, ...], tuple[Descriptor, type[Any]]] = field(
        default_factory=dict, compare=False
    )

    def message(self, path: tuple[int, ...]) -> tuple[Descriptor, type[Any]]:
        """The descriptor and message class at ``path``; LookupError names what is missing."""
        found = self._classes.get(path)
        if found is not None:
            return found
        names: list[str] = []
        types = self.file.message_type
        for depth, index in enumerate(path):
            if not 0 <= index < len(types):
                raise LookupError(
                    f"{self.label} has no message at index path {list(path)} "
                    f"(level {depth} holds {len(types)})"
                )
            names.append(types[index].name)
            types = types[index].nested_type
        package = f"{self.file.package}." if self.file.package else ""
        descriptor = self.pool.FindMessageTypeByName(package + ".".join(names))
        found = (descriptor, message_factory.GetMessageClass(descriptor))
        self._classes[path] = found
        return found


def parse_proto_schema(answer: RegistryAnswer, registry: SchemaRegistry) -> ProtoSchema:
    """The schema of a registry answer, its references fetched and everything compiled;
    SchemaUnavailable (``invalid``) says what is wrong with it."""
    if answer.kind != "PROTOBUF":
        raise SchemaUnavailable(
            "invalid", f"{answer.label} is a {answer.kind} schema, not Protobuf"
        )
    files: dict[str, str] = {}
    pending: list[Reference] = list(answer.references)
    while pending:
        reference = pending.pop()
        if reference.name in files or reference.name.startswith(_WELL_KNOWN):
            continue
        if len(files) >= _MAX_FILES:
            raise SchemaUnavailable(
                "invalid", f"{answer.label} references more than {_MAX_FILES} files"
            )
        referenced = registry.referenced(reference)
        files[reference.name] = referenced.text
        pending.extend(referenced.references)
    try:
        main, compiled = compile_files(answer.text, files)
    except ValueError as exc:
        raise SchemaUnavailable("invalid", f"{answer.label}: {exc}") from None
    pool = descriptor_pool.DescriptorPool()
    try:
        for proto in compiled.file:
            pool.Add(proto)
    except (TypeError, KeyError, ValueError) as exc:
        raise SchemaUnavailable("invalid", f"{answer.label}: {exc}") from None
    file = next(f for f in compiled.file if f.name == main)
    return ProtoSchema(answer.label, file, pool)


def _descriptor(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """A file given as a base64 ``FileDescriptorProto``; None for ``.proto`` text."""
    if not _BASE64.fullmatch(text):
        return None
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
    except (binascii.Error, DecodeError, ValueError):
        return None


def _safe(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not name.endswith(".proto"):
        raise ValueError(f"reference name {name!r} is not a relative .proto file name")
    return name


def compile_files(
    main: str, imports: dict[str, str]
) -> tuple[str, descriptor_pb2.FileDescriptorSet]:
    """``main`` (text or base64 descriptor) and the files it imports by name, compiled
    by protoc: the main file's name and every file's descriptor, dependencies first.
    ValueError carries protoc's own message."""
    with tempfile.TemporaryDirectory(prefix="icespool-proto-") as scratch:
        root = Path(scratch)
        given = descriptor_pb2.FileDescriptorSet()
        sources = root / "src"
        sources.mkdir()
        main_name = _MAIN
        for name, text in [(_MAIN, main), *imports.items()]:
            proto = _descriptor(text)
            if proto is None:
                target = sources / _safe(name)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
                continue
            if name == _MAIN:
                main_name = proto.name or _MAIN
            else:
                proto.name = _safe(name)
            given.file.append(proto)
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={sources}",
            f"--proto_path={_INCLUDE}",
            "--include_imports",
            f"--descriptor_set_out={root / 'out.pb'}",
        ]
        if given.file:
            (root / "given.pb").write_bytes(given.SerializeToString())
            command.append(f"--descriptor_set_in={root / 'given.pb'}")
        command.append(main_name)
        try:
            run = subprocess.run(
                command,
                cwd=sources,
                capture_output=True,
                text=True,
                timeout=_COMPILE_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ValueError(f"protoc did not run: {exc}") from None
        if run.returncode != 0:
            said = run.stderr.strip().replace(str(sources) + "/", "") or f"exit {run.returncode}"
            raise ValueError(f"not a valid Protobuf schema: {said}")
        compiled = descriptor_pb2.FileDescriptorSet.FromString((root / "out.pb").read_bytes())
    return main_name, compiled
