"""The deployment kit in config/ and the Dockerfile: every gateway YAML loads with the real
loader, the embedded default and config/gateway.yaml cannot drift, the compose file wires
what it claims, and the Dockerfile installs and starts the gateway as the README does.

(No Docker engine runs here: the image and the compose stack are checked by reading.)
"""

from __future__ import annotations

import re
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from triogate.batch import ClusterBackend
from triogate.config import load_config
from triogate.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "config"
NOT_GATEWAY = {"docker-compose.yaml"}
GATEWAY_YAMLS = sorted(p.name for p in CONFIG.glob("*.yaml") if p.name not in NOT_GATEWAY)

#: What an operator would export; each file names only some of these.
ENVIRON = {
    "TRIOGATE_MASTER_KEY": "sk-prod-master",
    "TRIOGATE_REDIS_URL": "redis://redis.internal:6379/0",
    "TRIOGATE_DATABASE_URL": "postgresql://gateway:pw@db.internal:5432/triogate",
    "OPENAI_API_KEY": "sk-openai",
    "OPENAI_API_KEY_2": "sk-openai-2",
    "ANTHROPIC_API_KEY": "sk-ant",
    "REDIS_CLUSTER_NODES": "10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379",
    "LITELLM_MASTER_KEY": "sk-litellm-master",
    "DATABASE_URL": "postgresql://litellm@db/litellm",
}


def file_environ(name: str) -> dict[str, str]:
    """ENVIRON minus the TRIOGATE_* overrides the file does not itself read, so that the
    file's own values are what gets checked."""
    text = (CONFIG / name).read_text()
    return {k: v for k, v in ENVIRON.items()
            if not k.startswith("TRIOGATE_") or f"os.environ/{k}" in text}


def test_the_kit_has_the_expected_gateway_configs() -> None:
    assert GATEWAY_YAMLS == ["cluster.yaml", "gateway.yaml", "litellm-migration.yaml",
                             "production.yaml"]


@pytest.mark.parametrize("name", GATEWAY_YAMLS)
def test_every_gateway_yaml_loads_with_the_real_loader(name: str) -> None:
    config = load_config(CONFIG / name, environ=file_environ(name))
    assert config.deployments
    for deployment in config.deployments:
        assert deployment.provider in ("openai", "anthropic", "mock")
    for group, fallbacks in config.router.fallbacks.items():
        assert group in config.groups and set(fallbacks) <= set(config.groups)


def test_serves_default_is_config_gateway_yaml_byte_for_byte() -> None:
    """The packaged file is the one ``serve`` reads (it ships in the wheel; config/ does
    not); config/gateway.yaml is its copy for readers of the repository, held equal here."""
    packaged = resources.files("triogate").joinpath("example.yaml").read_bytes()
    assert (CONFIG / "gateway.yaml").read_bytes() == packaged
    default = load_config(None, environ={})
    copy = load_config(CONFIG / "gateway.yaml", environ={})
    assert default.deployments == copy.deployments
    assert default.settings == copy.settings


def test_production_reads_its_servers_and_secrets_from_the_environment() -> None:
    config = load_config(CONFIG / "production.yaml", environ=file_environ("production.yaml"))
    assert config.settings.redis.url == ENVIRON["TRIOGATE_REDIS_URL"]
    assert config.database_url == ENVIRON["TRIOGATE_DATABASE_URL"]
    assert config.master_key == ENVIRON["TRIOGATE_MASTER_KEY"]
    assert config.settings.policies.budgets == "fail-closed"
    assert config.settings.tracing is True
    providers = {d.provider: d.api_key for d in config.deployments}
    assert providers == {"openai": "sk-openai", "anthropic": "sk-ant"}
    assert config.cache.enabled


@pytest.mark.parametrize("missing", ["TRIOGATE_REDIS_URL", "TRIOGATE_DATABASE_URL",
                                     "TRIOGATE_MASTER_KEY", "OPENAI_API_KEY"])
def test_production_refuses_to_start_without_its_environment(missing: str) -> None:
    environ = {k: v for k, v in file_environ("production.yaml").items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        load_config(CONFIG / "production.yaml", environ=environ)


def test_cluster_yaml_names_a_redis_cluster() -> None:
    config = load_config(CONFIG / "cluster.yaml", environ=file_environ("cluster.yaml"))
    url = config.settings.redis.url
    assert url is not None and ClusterBackend.is_cluster_url(url)
    assert url.endswith(ENVIRON["REDIS_CLUSTER_NODES"])


def test_the_litellm_file_has_only_litellm_sections() -> None:
    raw = yaml.safe_load((CONFIG / "litellm-migration.yaml").read_text())
    assert set(raw) <= {"model_list", "router_settings", "general_settings", "litellm_settings"}
    config = load_config(CONFIG / "litellm-migration.yaml",
                         environ=file_environ("litellm-migration.yaml"))
    assert config.master_key == ENVIRON["LITELLM_MASTER_KEY"]
    assert config.database_url == ENVIRON["DATABASE_URL"]


# --------------------------------------------------------------------------- compose


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CONFIG / "docker-compose.yaml").read_text())
    return loaded


def test_compose_runs_two_gateways_redis_postgres_and_prometheus() -> None:
    services = compose()["services"]
    assert {"gateway-1", "gateway-2", "redis", "postgres", "prometheus"} <= set(services)
    for name in ("gateway-1", "gateway-2"):
        gateway = services[name]
        build = gateway["build"]
        assert (CONFIG / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"
        env = gateway["environment"]
        assert "@redis:" in env["TRIOGATE_REDIS_URL"] or "//redis:" in env["TRIOGATE_REDIS_URL"]
        assert "@postgres:" in env["TRIOGATE_DATABASE_URL"]
        assert set(gateway["depends_on"]) == {"redis", "postgres"}
        assert gateway["command"][:1] == ["--config"]
        mounts = dict(v.split(":")[:2] for v in gateway["volumes"])
        config_in_container = gateway["command"][1]
        host_side = next(h for h, c in mounts.items() if c == config_in_container)
        assert (CONFIG / host_side).is_file()
        assert "/data" in mounts.values()  # each gateway keeps its own state volume
    assert services["gateway-1"]["volumes"] != services["gateway-2"]["volumes"]


def test_every_file_compose_mounts_exists() -> None:
    for service in compose()["services"].values():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (CONFIG / host).exists(), volume


def test_prometheus_scrapes_both_gateways_and_loads_the_alert_rules() -> None:
    prometheus = yaml.safe_load((CONFIG / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert targets == {"gateway-1:4000", "gateway-2:4000"}
    mounts = dict(v.split(":")[:2] for v in compose()["services"]["prometheus"]["volumes"])
    assert set(prometheus["rule_files"]) <= set(mounts.values())
    rules = yaml.safe_load((CONFIG / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"TriogateDegradedDecisions", "TriogateJournalBacklog", "TriogateSettlerQueue",
            "TriogateUpstreamErrorRate", "TriogateLatencyP99"} <= alerts


# --------------------------------------------------------------------------- Dockerfile


def dockerfile() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def readme_commands() -> tuple[list[str], list[str]]:
    """The README's first command: (install argv, start argv)."""
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "-m triogate serve" in line
                and "pip install" in line)
    install, start = line.split("#")[0].split("&&")
    return shlex.split(install), shlex.split(start)


def test_the_image_is_multi_stage_non_root_with_a_readiness_check_and_a_state_volume() -> None:
    lines = dockerfile()
    assert sum(line.startswith("FROM ") for line in lines) >= 2
    user = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert user and user[-1] not in ("root", "0")
    healthcheck = next(line for line in lines if line.startswith("HEALTHCHECK "))
    assert "/health/readiness" in healthcheck
    assert any(line.startswith("VOLUME ") and "/data" in line for line in lines)
    workdir = [line.split()[1] for line in lines if line.startswith("WORKDIR ")]
    assert workdir[-1] == "/data"  # the default state_dir (.triogate) lands in the volume


def test_the_image_installs_and_starts_the_gateway_as_the_readme_does() -> None:
    install, start = readme_commands()
    assert install[:4] == ["python3", "-m", "pip", "install"]
    readme_target = [a for a in install[4:] if not a.startswith("-")]
    runs = [shlex.split(line.removeprefix("RUN ")) for line in dockerfile()
            if line.startswith("RUN ")]
    pip = next(r for r in runs if r[1:4] == ["-m", "pip", "install"])
    # The same project and extras; only -e differs (an image is not a checkout).
    assert [a for a in pip[4:] if not a.startswith("-")] == readme_target
    entrypoint = next(line for line in dockerfile() if line.startswith("ENTRYPOINT "))
    argv = yaml.safe_load(entrypoint.removeprefix("ENTRYPOINT "))
    assert start[1:] == ["-m", "triogate", "serve"]
    assert argv[1:4] == start[1:]
    assert argv[0].startswith("python")
