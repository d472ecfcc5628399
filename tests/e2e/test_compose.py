"""docker-compose.yml as the compose tool reads it, without starting anything.

The file renders (alone and with docker-compose.host.yml); it refuses to render without the
two secrets; only the balancer publishes a port, on loopback unless told otherwise; every
long-running service has a health check; the nodes reach ARCA with its password and the
balancer reaches the nodes. Skipped when neither `docker compose` nor `docker-compose` is
installed (.ci/run installs Debian's docker-compose).
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.compose import COMPOSE, HOST_OVERRIDE, compose, compose_command, rendered

pytestmark = pytest.mark.skipif(compose_command() is None,
                                reason="neither `docker compose` nor `docker-compose` is installed")
SECRETS = {"REAME_ARCA_PASSWORD": "arca-pw", "REAME_API_KEY": "node-key"}
LONG_RUNNING = ("arca", "node-a", "node-b", "balancer")


def environment(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"), **extra}


@pytest.fixture(scope="module")
def services() -> dict:
    return rendered(environment(**SECRETS))["services"]


def published(service: dict) -> list[str]:
    """host_ip:published for each published port, whichever syntax the tool renders."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append(f"{port.get('host_ip', '0.0.0.0')}:{port['published']}")
        else:
            out.append(str(port).rsplit(":", 1)[0])
    return out


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_the_fleet_does_not_start_without_its_secrets(secret):
    result = compose(environment(**{k: v for k, v in SECRETS.items() if k != secret}), "config", check=False)
    assert result.returncode != 0 and secret in result.stderr


def test_only_the_balancer_is_published_and_on_loopback(services):
    assert set(LONG_RUNNING) <= set(services)
    assert {name for name, service in services.items() if service.get("ports")} == {"balancer"}
    assert published(services["balancer"]) == ["127.0.0.1:8080"]
    moved = rendered(environment(**SECRETS, REAME_LB_PUBLISH="0.0.0.0:80"))["services"]["balancer"]
    assert published(moved) == ["0.0.0.0:80"]


def test_every_long_running_service_is_health_checked(services):
    for name in LONG_RUNNING:
        assert services[name]["healthcheck"]["test"], name
    assert "redis-cli" in " ".join(services["arca"]["healthcheck"]["test"])
    assert "/health" in " ".join(services["node-a"]["healthcheck"]["test"])
    assert services["balancer"]["depends_on"]["node-a"]["condition"] == "service_healthy"
    assert services["node-b"]["depends_on"]["arca"]["condition"] == "service_healthy"


def test_secrets_reach_arca_and_the_nodes(services):
    assert services["arca"]["environment"]["REAME_ARCA_PASSWORD"] == "arca-pw"
    for name in ("node-a", "node-b"):
        env = services[name]["environment"]
        assert env["REAME_ARCA_PASSWORD"] == "arca-pw" and env["REAME_SERVER_API_KEY"] == "node-key"
        assert env["REAME_ARCA_REMOTE"] == "arca:6420"
    assert services["balancer"]["environment"]["REAME_NODE_A"] == "node-a:8080"


def test_volumes_keep_models_caches_and_the_archive(services):
    def targets(name: str) -> set[str]:
        return {(v["target"] if isinstance(v, dict) else v.split(":")[1]) for v in services[name]["volumes"]}

    assert "/var/lib/reame/arca" in targets("arca")
    for name in ("node-a", "node-b"):
        assert {"/var/lib/reame/models", "/var/lib/reame/cache"} <= targets(name)


def test_the_host_network_variant_binds_loopback_on_ports_of_its_own(services):
    merged = rendered(environment(**SECRETS), COMPOSE, HOST_OVERRIDE)["services"]
    running = {name: service for name, service in merged.items() if not service.get("profiles")}
    assert set(running) == {"arca", "node-a", "node-b", "balancer-host"}
    assert all(service["network_mode"] == "host" and not service.get("ports") for service in running.values())
    assert "127.0.0.1" in merged["arca"]["command"]
    ports = {merged["node-a"]["environment"]["REAME_SERVER_PORT"], merged["node-b"]["environment"]["REAME_SERVER_PORT"],
             merged["balancer-host"]["environment"]["REAME_LB_BIND"].rsplit(":", 1)[1]}
    assert len(ports) == 3
