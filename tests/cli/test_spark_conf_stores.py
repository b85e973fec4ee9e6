"""``icespool spark-conf`` for a REST catalog on S3 (and Glue): the exact Spark settings.

The pyiceberg keys Iceberg Java spells differently are translated, secrets stay out unless
asked for, the AWS bundle is named (or taken from the runtime directory), and an
S3-compatible store gets the AWS SDK's checksum settings. That Spark really reads through
these settings is tests/spark/test_spark_s3.py's part; here the POM that
``make spark-runtime`` copies is held to the coordinates spark-conf prints.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from icespool.cli import main
from icespool.config import validate_config
from icespool.spark.conf import (
    EXTENSIONS,
    ICEBERG_VERSION,
    MAVEN_AWS_BUNDLE,
    MAVEN_GCP_BUNDLE,
    MAVEN_POSTGRESQL,
    MAVEN_SQLITE,
    RUNTIME_DIR_ENV,
    SparkConfError,
    runtime_jars,
    spark_line,
    spark_settings,
)

POM = Path(__file__).resolve().parents[2] / "deploy" / "spark" / "pom.xml"
# Iceberg's runtime for Spark 4.1 (the default) and for Spark 3.5 (--spark 3.5).
MAVEN_ICEBERG_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.11.0"
MAVEN_ICEBERG_RUNTIME_35 = "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.11.0"
AWS_BUNDLE_JAR = f"iceberg-aws-bundle-{ICEBERG_VERSION}.jar"
CHECKSUMS = (
    "-Daws.requestChecksumCalculation=when_required -Daws.responseChecksumValidation=when_required"
)

REST_S3 = {
    "name": "lake",
    "type": "rest",
    "uri": "http://127.0.0.1:8181",
    "warehouse": "s3://warehouse",
    "credential": "client-id:client-secret",
    "header.X-Iceberg-Access-Delegation": "vended-credentials",
    "s3.endpoint": "http://127.0.0.1:8333",
    "s3.region": "us-east-1",
    "s3.access-key-id": "AKIDEXAMPLE",
    "s3.secret-access-key": "wJalrXUtnFEMI",
    "s3.request-timeout": "30",
}
P = "spark.sql.catalog.lake"
# Everything but the jars: the same with Maven packages or a runtime directory.
REST_S3_CATALOG = {
    # A custom s3.endpoint: the AWS SDK checksums only where S3 requires them.
    "spark.driver.defaultJavaOptions": CHECKSUMS,
    "spark.executor.defaultJavaOptions": CHECKSUMS,
    "spark.sql.extensions": EXTENSIONS,
    P: "org.apache.iceberg.spark.SparkCatalog",
    f"{P}.type": "rest",
    f"{P}.uri": "http://127.0.0.1:8181",
    f"{P}.warehouse": "s3://warehouse",
    f"{P}.cache-enabled": "false",
    f"{P}.header.X-Iceberg-Access-Delegation": "vended-credentials",
    f"{P}.s3.endpoint": "http://127.0.0.1:8333",
    f"{P}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
    # pyiceberg's s3.region is Iceberg Java's client.region.
    f"{P}.client.region": "us-east-1",
    # pyiceberg addresses buckets path-style; Java would use virtual hosts on the endpoint.
    f"{P}.s3.path-style-access": "true",
}
SECRETS = (f"{P}.credential", f"{P}.s3.access-key-id", f"{P}.s3.secret-access-key")


def test_rest_on_s3_settings_are_exactly_these() -> None:
    settings = spark_settings(validate_config({"catalog": REST_S3}))

    assert settings.conf == {
        "spark.jars.packages": f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_AWS_BUNDLE}",
        **REST_S3_CATALOG,
    }
    assert list(settings.conf) == ["spark.jars.packages", *REST_S3_CATALOG]
    assert settings.omitted_secrets == SECRETS


def test_rest_on_s3_with_secrets_adds_exactly_the_secrets() -> None:
    settings = spark_settings(validate_config({"catalog": REST_S3}), include_secrets=True)

    added = {k: v for k, v in settings.conf.items() if k not in REST_S3_CATALOG}
    assert added == {
        "spark.jars.packages": f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_AWS_BUNDLE}",
        f"{P}.credential": "client-id:client-secret",
        f"{P}.s3.access-key-id": "AKIDEXAMPLE",
        f"{P}.s3.secret-access-key": "wJalrXUtnFEMI",
    }
    assert settings.omitted_secrets == ()


def test_a_rest_warehouse_name_on_s3_still_gets_the_aws_bundle() -> None:
    """Polaris and Lakekeeper take a warehouse *name*; the tables are still on S3 (the
    s3.* keys say so), and Spark cannot open them without S3FileIO and the AWS SDK."""
    settings = spark_settings(validate_config({"catalog": {**REST_S3, "warehouse": "lake"}}))
    assert settings.conf == {
        "spark.jars.packages": f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_AWS_BUNDLE}",
        **REST_S3_CATALOG,
        f"{P}.warehouse": "lake",
    }


def test_uris_with_a_password_are_secrets_too() -> None:
    """check-config redacts a password in any URI; spark-conf printed it (the REST uri,
    an S3 proxy) in the clear."""
    catalog = {
        **REST_S3,
        "uri": "http://bob:pw-Zq1@127.0.0.1:8181",
        "s3.proxy-uri": "http://proxy:pw-Zq2@127.0.0.1:3128",
    }
    settings = spark_settings(validate_config({"catalog": catalog}))
    assert not [v for v in settings.conf.values() if "Zq" in v]
    assert settings.omitted_secrets == (f"{P}.uri", *SECRETS[:2], f"{P}.s3.proxy-uri", *SECRETS[2:])
    shown = spark_settings(validate_config({"catalog": catalog}), include_secrets=True)
    assert shown.conf[f"{P}.uri"] == catalog["uri"]
    assert shown.conf[f"{P}.s3.proxy-uri"] == catalog["s3.proxy-uri"]


@pytest.mark.parametrize(
    ("extra", "path_style"),
    [
        ({"s3.force-virtual-addressing": "true"}, "false"),
        ({"s3.force-virtual-addressing": "false"}, "true"),
        ({"s3.path-style-access": "false"}, "false"),  # Java's own key wins as written
    ],
)
def test_addressing_style_follows_pyicebergs(extra: dict[str, str], path_style: str) -> None:
    settings = spark_settings(validate_config({"catalog": {**REST_S3, **extra}}))
    assert settings.conf[f"{P}.s3.path-style-access"] == path_style
    assert f"{P}.s3.force-virtual-addressing" not in settings.conf


def test_aws_without_a_custom_endpoint_keeps_virtual_hosted_buckets() -> None:
    catalog = {k: v for k, v in REST_S3.items() if k != "s3.endpoint"}
    settings = spark_settings(validate_config({"catalog": catalog}))
    assert f"{P}.s3.path-style-access" not in settings.conf
    assert settings.conf[f"{P}.client.region"] == "us-east-1"
    # AWS S3 itself takes the SDK's default checksums: no JVM options.
    assert [k for k in settings.conf if "JavaOptions" in k] == []


def test_glue_settings_name_the_aws_bundle_and_omit_the_glue_secret() -> None:
    catalog = {
        "name": "lake",
        "type": "glue",
        "warehouse": "s3://lake/warehouse",
        "glue.region": "eu-west-1",
        "glue.secret-access-key": "wJalrXUtnFEMI",
        "glue.endpoint": "http://127.0.0.1:5000",
    }
    settings = spark_settings(validate_config({"catalog": catalog}))
    assert settings.conf["spark.jars.packages"] == f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_AWS_BUNDLE}"
    assert settings.conf[f"{P}.catalog-impl"] == "org.apache.iceberg.aws.glue.GlueCatalog"
    assert settings.conf[f"{P}.client.region"] == "eu-west-1"
    assert settings.conf[f"{P}.glue.endpoint"] == "http://127.0.0.1:5000"
    assert settings.omitted_secrets == (f"{P}.glue.secret-access-key",)


def _jar(path: Path, *members: str) -> Path:
    with zipfile.ZipFile(path, "w") as jar:
        for member in members or ("META-INF/MANIFEST.MF",):
            jar.writestr(member, b"")
    return path


def test_runtime_directory_without_the_bundle_asks_spark_to_fetch_only_it(
    tmp_path: Path,
) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    names = [f"iceberg-spark-runtime-4.1_2.13-{ICEBERG_VERSION}.jar", "sqlite-jdbc-3.54.1.0.jar"]
    for name in names:
        _jar(runtime / name)
    config = validate_config({"catalog": REST_S3})

    settings = spark_settings(config, runtime_dir=runtime)
    assert settings.conf["spark.jars"] == ",".join(str(runtime / n) for n in names)
    assert settings.conf["spark.jars.packages"] == MAVEN_AWS_BUNDLE

    _jar(runtime / AWS_BUNDLE_JAR)
    settings = spark_settings(config, runtime_dir=runtime)
    assert settings.conf["spark.jars"] == ",".join(
        str(runtime / n) for n in [names[0], AWS_BUNDLE_JAR, names[1]]
    )
    assert "spark.jars.packages" not in settings.conf
    assert {k: v for k, v in settings.conf.items() if k != "spark.jars"} == REST_S3_CATALOG


def test_spark_conf_cli_prints_rest_on_s3_and_names_the_secrets_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No local runtime (`make test` exports $ICESPOOL_SPARK_RUNTIME): the Maven packages.
    monkeypatch.delenv(RUNTIME_DIR_ENV, raising=False)
    lines = "\n".join(f'"{k}" = "{v}"' for k, v in REST_S3.items())
    path = tmp_path / "icespool.toml"
    path.write_text(f"[catalog]\n{lines}\n")

    assert main(["spark-conf", "--config", str(path), "--format", "properties"]) == 0

    printed = capsys.readouterr()
    expected = {"spark.jars.packages": f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_AWS_BUNDLE}"}
    expected.update(REST_S3_CATALOG)
    assert printed.out == "".join(f"{k} {v}\n" for k, v in expected.items())
    for key in SECRETS:
        assert f"secret {key} left out" in printed.err
    assert "wJalrXUtnFEMI" not in printed.out + printed.err


def _pom_coordinates(profile: str | None = None) -> set[str]:
    """group:artifact:version of every dependency deploy/spark/pom.xml pins, with the
    properties of ``profile`` (None: the default build)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(POM).getroot()
    props = {el.tag.split("}")[1]: el.text or "" for el in root.find("m:properties", ns) or []}
    for candidate in root.findall("m:profiles/m:profile", ns):
        if candidate.findtext("m:id", "", ns) == profile:
            section = candidate.find("m:properties", ns) or []
            props.update({el.tag.split("}")[1]: el.text or "" for el in section})
    found = set()
    for dep in root.findall("m:dependencies/m:dependency", ns):
        group, artifact, version = (
            re.sub(r"\$\{([^}]+)\}", lambda m: props[m.group(1)], dep.findtext(f"m:{k}", "", ns))
            for k in ("groupId", "artifactId", "version")
        )
        found.add(f"{group}:{artifact}:{version}")
    return found


@pytest.mark.parametrize(
    ("profile", "runtime"), [(None, MAVEN_ICEBERG_RUNTIME), ("spark-3.5", MAVEN_ICEBERG_RUNTIME_35)]
)
def test_the_pom_make_spark_runtime_copies_pins_what_spark_conf_prints(
    profile: str | None, runtime: str
) -> None:
    """`make spark-runtime` (the local jars; `make spark35` with the profile) and
    spark.jars.packages (Spark fetching them) must be the same releases: a runtime
    directory stands in for these packages."""
    assert _pom_coordinates(profile) == {
        runtime,
        MAVEN_AWS_BUNDLE,
        MAVEN_GCP_BUNDLE,
        MAVEN_POSTGRESQL,
        MAVEN_SQLITE,
    }


GCS = {
    "name": "lake",
    "type": "sql",
    "uri": "sqlite:////var/lib/icespool/catalog.db",
    "warehouse": "gs://lake/warehouse",
    "gcs.service.host": "http://127.0.0.1:4443",
    "gcs.project-id": "icespool",
    "gcs.oauth2.token": "ya29.secret-token",
    "gcs.oauth2.token-expires-at": "4102444800000",
}


def test_gs_warehouse_gets_gcs_file_io_and_the_gcp_bundle() -> None:
    """JdbcCatalog's default HadoopFileIO cannot open gs://; pyiceberg's gcs.* keys are
    Iceberg Java's too and pass on as written."""
    settings = spark_settings(validate_config({"catalog": GCS}))
    assert settings.conf == {
        "spark.jars.packages": f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_SQLITE},{MAVEN_GCP_BUNDLE}",
        "spark.sql.extensions": EXTENSIONS,
        P: "org.apache.iceberg.spark.SparkCatalog",
        f"{P}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        f"{P}.uri": "jdbc:sqlite:/var/lib/icespool/catalog.db",
        f"{P}.jdbc.schema-version": "V1",
        f"{P}.jdbc.init-catalog-tables": "false",
        f"{P}.warehouse": "gs://lake/warehouse",
        f"{P}.cache-enabled": "false",
        f"{P}.gcs.project-id": "icespool",
        f"{P}.gcs.service.host": "http://127.0.0.1:4443",
        f"{P}.io-impl": "org.apache.iceberg.gcp.gcs.GCSFileIO",
    }
    # check-config redacts the token's expiry too (a "token" key): it is left out alike.
    assert settings.omitted_secrets == (
        f"{P}.gcs.oauth2.token",
        f"{P}.gcs.oauth2.token-expires-at",
    )
    # A warehouse *name* (a REST catalog's) with gcs.* keys: the tables are on GCS still.
    rest = {"name": "lake", "type": "rest", "uri": "http://127.0.0.1:8181", "warehouse": "lake"}
    named = spark_settings(validate_config({"catalog": {**rest, "gcs.project-id": "p"}}))
    assert named.conf["spark.jars.packages"] == f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_GCP_BUNDLE}"
    assert named.conf[f"{P}.io-impl"] == "org.apache.iceberg.gcp.gcs.GCSFileIO"
    # Elsewhere neither the GCP bundle nor GCSFileIO.
    local = spark_settings(validate_config({"catalog": {**GCS, "warehouse": "file:///w"}}))
    assert local.conf["spark.jars.packages"] == f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_SQLITE}"
    assert f"{P}.io-impl" not in local.conf


def test_spark_35_names_its_own_runtime_and_finds_it_in_a_directory(tmp_path: Path) -> None:
    config = validate_config({"catalog": REST_S3})
    settings = spark_settings(config, spark="3.5")
    assert settings.conf["spark.jars.packages"] == f"{MAVEN_ICEBERG_RUNTIME_35},{MAVEN_AWS_BUNDLE}"
    assert {k: v for k, v in settings.conf.items() if k != "spark.jars.packages"} == (
        REST_S3_CATALOG
    )

    runtime = tmp_path / "runtime35"
    runtime.mkdir()
    jars = [
        _jar(runtime / f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"),
        _jar(runtime / AWS_BUNDLE_JAR),
    ]
    assert runtime_jars(runtime, "3.5") == jars
    from_dir = spark_settings(config, runtime_dir=runtime, spark="3.5")
    assert from_dir.conf["spark.jars"] == ",".join(str(jar) for jar in jars)
    assert "spark.jars.packages" not in from_dir.conf


def test_a_runtime_directory_of_another_spark_is_refused_naming_what_it_holds(
    tmp_path: Path,
) -> None:
    runtime = tmp_path / "runtime35"
    runtime.mkdir()
    _jar(runtime / f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar")

    with pytest.raises(SparkConfError) as refused:
        spark_settings(validate_config({"catalog": REST_S3}), runtime_dir=runtime)
    assert str(refused.value) == (
        f"Spark runtime directory {str(runtime)!r} has no iceberg-spark-runtime-4.1_2.13-*.jar "
        f"(it holds iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar: another Spark's); "
        "build it with 'make spark-runtime' (deploy/spark/pom.xml's jars from Maven Central)"
    )


@pytest.mark.parametrize(("version", "line"), [("4.1.4", "4.1"), ("3.5.9", "3.5"), ("4.1", "4.1")])
def test_spark_line_of_a_version(version: str, line: str) -> None:
    assert spark_line(version) == line


@pytest.mark.parametrize("version", ["4.3.0", "4.0.1", "3.4.4", "four"])
def test_a_spark_without_an_iceberg_runtime_here_is_refused_naming_those_there_are(
    version: str,
) -> None:
    with pytest.raises(SparkConfError) as refused:
        spark_settings(validate_config({"catalog": REST_S3}), spark=version)
    assert str(refused.value) == (
        f"Spark {version!r}: icespool's Iceberg 1.11.0 runtimes are for Spark 4.1 and 3.5 "
        "(pip install 'icespool[spark]' brings pyspark 4.1)"
    )


def test_spark_conf_cli_spark_35_prints_the_35_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RUNTIME_DIR_ENV, raising=False)
    path = tmp_path / "icespool.toml"
    path.write_text('[catalog]\nname = "lake"\ntype = "sql"\nuri = "sqlite:////db/catalog.db"\n')

    assert main(["spark-conf", "--config", str(path), "--spark", "3.5", "--format", "json"]) == 0
    printed = capsys.readouterr()
    assert printed.err == ""
    assert json.loads(printed.out)["spark.jars.packages"] == (
        f"{MAVEN_ICEBERG_RUNTIME_35},{MAVEN_SQLITE}"
    )
    assert main(["spark-conf", "--config", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spark.jars.packages"] == (
        f"{MAVEN_ICEBERG_RUNTIME},{MAVEN_SQLITE}"
    )


def test_spark_conf_cli_refuses_a_spark_it_has_no_runtime_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "icespool.toml"
    path.write_text('[catalog]\nname = "lake"\ntype = "sql"\nuri = "sqlite:////db/catalog.db"\n')

    with pytest.raises(SystemExit) as stopped:
        main(["spark-conf", "--config", str(path), "--spark", "4.3"])
    assert stopped.value.code == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    assert "argument --spark: invalid choice: '4.3' (choose from '4.1', '3.5')" in printed.err
