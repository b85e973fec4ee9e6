"""The fence around aiokafka's internals (daemon/kafka/_upstream/).

- The contract check passes on the installed aiokafka, and names what changed in one
  line when a private name is gone, takes other parameters, a copied step sequence
  (``getmany``, ``Fetcher.fetched_records``) changes, or the version is outside the
  tested range (the module objects are monkeypatched here; production has no hook).
- A daemon with a Kafka source fails at start with that one line.
- The SCRAM refusal is read from aiokafka's own frame, as the fence expects it.
- No module outside the fence touches aiokafka's private names (an AST scan of daemon/).
"""

from __future__ import annotations

import ast
import asyncio
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import aiokafka
import aiokafka.client as client_module
import aiokafka.consumer.fetcher as fetcher_module
import pytest
from aiokafka.conn import ScramAuthenticator
from support.private_names import defined_by, outside, private_attributes, touches

from icespool.kafka._upstream import _contract
from icespool.kafka._upstream._bootstrap_log import quiet_bootstrap_log
from icespool.kafka._upstream._contract import PINS, UpstreamContractError, check_contract
from icespool.kafka._upstream._probe import scram_final_message

REPO = Path(__file__).resolve().parents[2]
FENCE = REPO / "daemon" / "kafka" / "_upstream"
VERSION = aiokafka.__version__
WHERE = "icespool's fence daemon/kafka/_upstream/"


# ---------------------------------------------------------------- the contract


def test_installed_aiokafka_meets_the_contract() -> None:
    assert _contract.problems() == []
    check_contract()  # no exception: the installed version is the tested one
    assert VERSION.startswith("0.14.")


@pytest.mark.parametrize("pin", PINS, ids=lambda pin: pin.target)
def test_each_private_name_is_as_pinned(pin: _contract.Pin) -> None:
    assert _contract.problems([pin]) == []
    assert (FENCE / pin.fence).is_file(), f"{pin.fence} names no module of the fence"


def test_every_fence_module_is_pinned() -> None:
    modules = {p.name for p in FENCE.glob("_*.py")} - {"__init__.py", "_contract.py"}
    assert modules == {pin.fence for pin in PINS}


def _raised() -> str:
    with pytest.raises(UpstreamContractError) as caught:
        check_contract()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_missing_name_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(fetcher_module.PartitionRecords, "_consume_aborted_up_to")
    assert _raised() == (
        f"aiokafka {VERSION}: aiokafka.consumer.fetcher.PartitionRecords._consume_aborted_up_to "
        f"is gone; {WHERE}_batches.py needs an update"
    )


def test_a_missing_module_constant_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher_module, "READ_COMMITTED", 2)
    assert _raised() == (
        f"aiokafka {VERSION}: aiokafka.consumer.fetcher.READ_COMMITTED is 2, no longer 1; "
        f"{WHERE}_batches.py needs an update"
    )


def test_changed_parameters_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    async def send(self: Any, node: int, request: Any) -> Any:
        return None

    monkeypatch.setattr(client_module.AIOKafkaClient, "send", send)
    assert _raised() == (
        f"aiokafka {VERSION}: aiokafka.client.AIOKafkaClient.send no longer takes "
        f"(self, node_id, request) but (self, node, request); {WHERE}_raw_fetch.py needs an "
        "update"
    )


def test_a_step_added_to_fetched_records_turns_red(monkeypatch: pytest.MonkeyPatch) -> None:
    original = fetcher_module.Fetcher.fetched_records

    async def fetched_records(
        self: Any,
        partitions: Any,
        timeout: float = 0,  # noqa: ASYNC109 (upstream's signature)
        max_records: int | None = None,
    ) -> Any:
        self._check_leader_epochs()  # a step _batches does not take
        return await original(self, partitions, timeout, max_records)

    monkeypatch.setattr(fetcher_module.Fetcher, "fetched_records", fetched_records)
    message = _raised()
    assert message.startswith(
        f"aiokafka {VERSION}: aiokafka.consumer.fetcher.Fetcher.fetched_records changed its "
        "steps (+_check_leader_epochs, -FetchResult, "
    )
    assert message.endswith(f"; {WHERE}_batches.py needs an update")


def test_several_changes_say_how_many_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(fetcher_module.Fetcher, "_create_fetch_waiter")
    monkeypatch.delattr(client_module.AIOKafkaClient, "get_random_node")
    assert _raised() == (
        f"aiokafka {VERSION}: aiokafka.consumer.fetcher.Fetcher._create_fetch_waiter is gone; "
        f"{WHERE}_batches.py needs an update (and 1 more)"
    )


def test_a_message_no_longer_said_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    async def bootstrap(self: Any) -> None:
        raise ConnectionError("Cannot bootstrap")  # an upstream that reworded its messages

    monkeypatch.setattr(client_module.AIOKafkaClient, "bootstrap", bootstrap)
    assert _raised() == (
        f"aiokafka {VERSION}: aiokafka.client.AIOKafkaClient.bootstrap no longer says "
        f"'Unable to bootstrap from '; {WHERE}_probe.py needs an update (and 1 more)"
    )
    assert _contract.problems()[1] == (
        "aiokafka.client.AIOKafkaClient.bootstrap no longer says 'Unable connect to "
        '"%s:%s": %s\', \'Unable to request metadata from "%s:%s": %s\'; '
        f"{WHERE}_bootstrap_log.py"
    )


def test_a_version_outside_the_tested_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiokafka, "__version__", "0.15.0")
    assert _raised() == (
        "aiokafka 0.15.0: outside the versions icespool's fence daemon/kafka/_upstream/ "
        "was tested with (>=0.14,<0.15); install a version in that range"
    )


def test_a_daemon_with_a_kafka_source_fails_at_start_with_the_one_line(tmp_path: Path) -> None:
    """A real daemon process fails at start with the one line (the module object changed
    before the daemon is imported, as an upgraded aiokafka would be); no broker is needed:
    the fence is checked when the source is imported."""
    script = textwrap.dedent(
        """
        import sys
        import aiokafka.consumer.fetcher as fetcher
        del fetcher.PartitionRecords._consume_aborted_up_to  # an upstream that renamed it
        from icespool.cli import main
        sys.exit(main(["run", "--config", sys.argv[1]]))
        """
    )
    config = tmp_path / "icespool.toml"
    config.write_text(
        f'[catalog]\nname = "c"\ntype = "sql"\nuri = "sqlite:///{tmp_path}/c.db"\n'
        f'warehouse = "file://{tmp_path}/warehouse"\n[spool]\ndir = "{tmp_path}/spool"\n'
        '[http]\nlisten = "127.0.0.1:0"\n'
        '[[kafka]]\nbootstrap_servers = "127.0.0.1:1"\ngroup_id = "g"\ntopics = ["events"]\n'
        'table = "demo.events"\n'
        '[[tables]]\nname = "demo.events"\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    message = (
        f"aiokafka {VERSION}: aiokafka.consumer.fetcher.PartitionRecords._consume_aborted_up_to "
        f"is gone; {WHERE}_batches.py needs an update"
    )
    assert done.stderr.count(message) == 1, done.stderr
    assert f"cannot start: {message}" in done.stderr.splitlines()[-1]


# ---------------------------------------------------------------- replaced behaviours


def test_the_scram_refusal_is_read_from_aiokafkas_frame() -> None:
    """What _probe reads: the broker's final SCRAM message, from the frame of aiokafka's
    own method that fails on it (KeyError 'v' on an RFC 5802 error)."""

    async def refused() -> BaseException:
        scram = ScramAuthenticator(
            loop=asyncio.get_running_loop(),
            sasl_plain_password="secret",
            sasl_plain_username="alice",
            sasl_mechanism="SCRAM-SHA-256",
        )
        try:
            scram.process_server_final_message("e=unknown-user")
        except KeyError as exc:
            return exc
        raise AssertionError("aiokafka accepted a refusal")

    exc = asyncio.run(refused())
    assert exc.args == ("v",)
    assert scram_final_message(exc) == (True, "e=unknown-user")
    assert scram_final_message(KeyError("v")) == (False, None)


def test_bootstrap_failures_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """aiokafka's own per-server line (its format string, as the fence pins it) is kept
    at debug level only; its other error lines stay as they are."""
    logger = logging.getLogger("aiokafka")
    quiet_bootstrap_log()
    filters = list(logger.filters)
    quiet_bootstrap_log()  # idempotent: no second filter
    assert logger.filters == filters
    server = 'Unable connect to "%s:%s": %s'
    with caplog.at_level(logging.INFO, logger="aiokafka"):
        logger.error(server, "broker", 9092, "refused")
        logger.error("Unable connect to node with id %s: %s", 1, "refused")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "Unable connect to node with id 1: refused")
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="aiokafka"):
        logger.error(server, "broker", 9092, "refused")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", 'Unable connect to "broker:9092": refused')
    ]


# ---------------------------------------------------------------- nothing outside the fence


def scan(library: str, package: Path, fence: Path) -> list[str]:
    """Touches of ``library``'s private names in daemon/ outside ``fence``."""
    vocabulary = private_attributes(package)
    found: list[str] = []
    for path, tree in outside(REPO / "daemon", fence).items():
        # A private name the module defines for itself (its own `_client`, `_lock`)
        # says nothing about whom an access reaches; the other rules still apply.
        own = vocabulary - defined_by(tree)
        found += touches(path.relative_to(REPO), tree, library, own)
    return found


def test_nothing_outside_the_fence_touches_aiokafka_private_names() -> None:
    package = Path(aiokafka.__file__).parent
    assert {"_client", "_coordinator", "_fetcher", "_records"} <= private_attributes(package)
    assert scan("aiokafka", package, FENCE) == []


def test_the_scan_sees_a_touch() -> None:
    """The scan is not blind: each rule flags the forms it is for."""
    tree = ast.parse(
        textwrap.dedent(
            """
            import aiokafka.consumer.fetcher as fetcher
            from aiokafka.record.default_records import _DefaultRecordBatchPy
            from aiokafka import AIOKafkaConsumer

            class Mine(AIOKafkaConsumer):
                def _update_fetch_positions(self, partitions):
                    return partitions

            async def offsets(consumer, tps):
                fetcher._unpack_records()
                return await consumer._coordinator.fetch_committed_offsets(tps)
            """
        )
    )
    found = touches(Path("daemon/x.py"), tree, "aiokafka", {"_coordinator"})
    assert found == [
        "daemon/x.py:3: imports aiokafka.record.default_records._DefaultRecordBatchPy",
        "daemon/x.py:11: fetcher..._unpack_records",
        "daemon/x.py:12: ._coordinator (a aiokafka private name)",
        "daemon/x.py:7: Mine overrides aiokafka's _update_fetch_positions",
    ]
