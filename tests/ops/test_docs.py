"""The documentation site: generated reference pages match the code, and the site builds
in strict mode (a broken link, a missing page or a page outside the nav fails)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_generated_reference_pages_match_the_code() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "docs" / "gen_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_every_config_key_and_metric_is_in_the_reference() -> None:
    """Spot checks that the generator reads the live model and registry, not a copy."""
    from icespool.config import Config
    from icespool.metrics import Metrics

    config_page = (REPO / "docs" / "reference" / "configuration.md").read_text()
    for section, model in Config.model_fields.items():
        assert f"[{section}]" in config_page or f"[[{section}]]" in config_page
        del model
    for key in ("claim_ttl", "max_columns", "metadata_max_age", "isolation_level"):
        assert f"| `{key}` |" in config_page, key
    # The tightest bounds, in the key's units: not the duration type's "> 0" beside the
    # field's own ">= 3", in seconds.
    assert '| `claim_ttl` | duration | `"30s"` | >= 3s, <= 1h |' in config_page
    metrics_page = (REPO / "docs" / "reference" / "metrics.md").read_text()
    families = {
        family.name
        for family in Metrics().registry.collect()
        if family.name.startswith("icespool_")
    }
    assert families
    for name in families:
        assert f"`{name}" in metrics_page, name


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "reference" / "configuration.html").is_file()
    # Opened from disk, every page's links name files, never a directory (which a
    # browser shows as a listing there). 404.html is a server's page: its links are
    # absolute on purpose.
    for page in set(tmp_path.rglob("*.html")) - {tmp_path / "404.html"}:
        for link in re.findall(r'href="([^"#?]*)"', page.read_text()):
            if link and "://" not in link and not link.startswith(("mailto:", "data:")):
                target = (page.parent / link).resolve()
                assert target.is_file(), f"{page.relative_to(tmp_path)} links to {link}"


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    for link in ("docs/getting-started.md", "docs/configuration.md", "docs/troubleshooting.md"):
        assert link in readme, link
        assert (REPO / link).is_file(), link
