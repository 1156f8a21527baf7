"""The operator attacks a client that pins its tenant (issue #46, attacks 1 and 4), through all three
client entry points: `SealedOpenAI`, `sealed proxy` and `sealed verify`.

Attack 1: a second broker of the genuine build (the real key broker, in process, with its own fresh
state) at the client's broker: the operator registers its own policy-admin key for the tenant there
(first registration), imports a data key of its own, signs a release policy admitting its own image,
and its image gets a key by the real release protocol. The operator also holds the publisher key and
publishes a reference-value statement adding its image. On main the client accepted that worker and
sent it the canary; here each entry point refuses it, naming what failed, and nothing is sent.

Attack 4: a policy downgrade. The client verified a worker under the tenant's newer release and data
policy; the operator then routes it to a worker still on the older ones, in the same session and in
the next one (the client's state file remembers). Refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.testclient import TestClient

from protocol.broker.client import obtain_data_key
from protocol.model_ref import ModelRef
from sealed_client import ClientTrust, SealedOpenAI
from sealed_client.errors import PolicyDowngrade, TenantPinError
from sealed_client.memory import ClientMemory
from sealed_client.proxy import create_proxy_app
from tests.key_broker.conftest import Harness
from tests.security.conftest import WallClock
from tests.security.tenant_pin_harness import (
    CANARY,
    GENUINE,
    MODEL,
    TENANT,
    VERSION,
    OperatorGateway,
    StandInWorker,
    TenantKeys,
    client_policy,
    genuine_issuer,
    operator_gateway,
    publisher_statement,
)

OPERATOR_IMAGE = "cd" * 48


def ask(client: SealedOpenAI) -> Any:
    return client.chat.completions.create(model=MODEL, max_tokens=4,
                                          messages=[{"role": "user", "content": CANARY}])


def sealed_openai(gateway: OperatorGateway, policy: dict[str, Any] | str) -> SealedOpenAI:
    return SealedOpenAI(base_url=f"{gateway.url}/v1", api_key="sk-tenant", policy=policy, max_retries=0)


@pytest.fixture()
def gateway() -> Iterator[OperatorGateway]:
    with operator_gateway() as gw:
        yield gw


@pytest.fixture()
def second_broker(tmp_path: Path) -> Iterator[Harness]:
    """A fresh broker of the genuine build: nothing of the tenant's in its state."""
    harness = Harness(tmp_path / "second-broker", WallClock())
    yield harness
    harness.close()


def operator_worker(broker: Harness, states: str, tenant: TenantKeys) -> StandInWorker:
    """The operator's own image, given a key by the second broker under the operator's release policy.
    `states`: which release policy its statement names: the one its key came under (`own`), the
    tenant's genuine one (replayed: it does not name this image), or none."""
    broker.setup_tenant(TENANT, MODEL, VERSION, measurements=(OPERATOR_IMAGE,))  # registers the operator's key
    worker = StandInWorker(broker.platform, OPERATOR_IMAGE)
    released = obtain_data_key(broker.client, ModelRef(TENANT, MODEL, VERSION), make_bundle=worker.make_bundle,
                               hpke_key=worker.key.private_key)
    assert released.release_policy is not None and released.release_policy["payload"]["allowed_measurements"] == [
        OPERATOR_IMAGE]
    worker.token = released.token
    worker.envelope = {"own": released.release_policy, "tenant's": tenant.release_policy(), "none": None}[states]
    return worker


def attack_one(gateway: OperatorGateway, broker: Harness, states: str) -> tuple[dict[str, Any], TenantKeys]:
    tenant = TenantKeys()
    worker = operator_worker(broker, states, tenant)
    publisher = Ed25519PrivateKey.generate()  # the operator is also the publisher
    gateway.reference_values = publisher_statement(publisher, [GENUINE, OPERATOR_IMAGE])
    gateway.shown = [worker]
    jwks = broker.client.get("/.well-known/jwks.json").json()
    return client_policy(broker.platform, jwks, tenant, publisher), tenant


STATES = ["own", "tenant's", "none"]
WHY = {"own": "not signed by the pinned tenant key", "tenant's": "is not one the tenant's signed release policy",
       "none": "does not state under which tenant-signed release policy"}


@pytest.mark.parametrize("states", STATES)
def test_attack1_second_broker_sealed_openai_refuses(gateway: OperatorGateway, second_broker: Harness,
                                                     states: str) -> None:
    policy, _ = attack_one(gateway, second_broker, states)
    with pytest.raises(TenantPinError) as refused:
        ask(sealed_openai(gateway, policy))
    assert WHY[states] in str(refused.value)
    assert gateway.sealed_posts == 0 and not gateway.canary_opened()


@pytest.mark.parametrize("states", STATES)
def test_attack1_second_broker_sealed_proxy_refuses(gateway: OperatorGateway, second_broker: Harness,
                                                    states: str) -> None:
    policy, _ = attack_one(gateway, second_broker, states)
    app = create_proxy_app(f"{gateway.url}/v1", ClientTrust.from_dict(policy))
    with TestClient(app) as local:
        answer = local.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-tenant"},
                            json={"model": MODEL, "messages": [{"role": "user", "content": CANARY}]})
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "TenantPinError" and WHY[states] in answer.json()["error"]["message"]
    assert gateway.sealed_posts == 0 and not gateway.canary_opened()


@pytest.mark.parametrize("states", STATES)
def test_attack1_second_broker_sealed_verify_refuses(gateway: OperatorGateway, second_broker: Harness,
                                                     states: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from api.cli.main import build

    policy, _ = attack_one(gateway, second_broker, states)
    path = tmp_path / "client-policy.json"
    path.write_text(json.dumps(policy))
    result = CliRunner().invoke(build(), ["verify", gateway.url, "--policy", str(path)])
    assert result.exit_code == 1, result.output
    assert "NOT verified (TenantPinError)" in result.output and WHY[states] in result.output.replace("\n  ", " ")
    assert "0 of 1 workers verified" in result.output


def test_the_genuine_worker_is_accepted_by_all_three(gateway: OperatorGateway, tmp_path: Path) -> None:
    """The control case: the tenant's own release policy names the worker's image; its key came under it."""
    from typer.testing import CliRunner

    from api.cli.main import build

    issuer, tenant, platform = genuine_issuer(), TenantKeys(), Ed25519PrivateKey.generate()
    worker = StandInWorker(platform, GENUINE, envelope=tenant.release_policy())
    worker.attest_with(issuer)
    gateway.shown = [worker]
    publisher = Ed25519PrivateKey.generate()
    gateway.reference_values = publisher_statement(publisher, [GENUINE])
    policy = client_policy(platform, issuer.jwks(), tenant, publisher)
    client = sealed_openai(gateway, policy)
    assert ask(client).choices[0].message.content == "an answer"
    pin = client.sealed.pinned(MODEL)
    assert pin is not None and pin.release is not None and (pin.release.policy_id, pin.release.version) == ("acme-m", 1)
    with TestClient(create_proxy_app(f"{gateway.url}/v1", ClientTrust.from_dict(policy))) as local:
        assert local.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-tenant"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    path = tmp_path / "client-policy.json"
    path.write_text(json.dumps(policy))
    result = CliRunner().invoke(build(), ["verify", gateway.url, "--policy", str(path)])
    assert result.exit_code == 0, result.output
    assert "tenant-signed release policy acme-m v1" in result.output and "1 of 1 workers verified" in result.output


# -- attack 4: a policy downgrade


def downgrade_world(gateway: OperatorGateway, tmp_path: Path) -> tuple[dict[str, Any], StandInWorker, StandInWorker]:
    """Worker `newer` runs under the tenant's release policy v2 and data policy v2; `older` under v1 of both."""
    issuer, tenant, platform = genuine_issuer(), TenantKeys(), Ed25519PrivateKey.generate()
    newer = StandInWorker(platform, GENUINE, policy_version=2, envelope=tenant.release_policy(version=2))
    older = StandInWorker(platform, GENUINE, policy_version=1, envelope=tenant.release_policy(version=1))
    for worker in (newer, older):
        worker.attest_with(issuer)
    state = ClientMemory.create(tmp_path / "client-state.json")
    return client_policy(platform, issuer.jwks(), tenant, state_file=str(state)), newer, older


def test_attack4_downgrade_within_one_session_is_refused(gateway: OperatorGateway, tmp_path: Path) -> None:
    policy, newer, older = downgrade_world(gateway, tmp_path)
    client = sealed_openai(gateway, policy)
    gateway.shown = [newer]
    assert ask(client).choices[0].message.content == "an answer"
    gateway.shown = [older]  # the newer worker "is gone": the client verifies again and finds the older one
    with pytest.raises(PolicyDowngrade) as refused:
        ask(client)
    assert "a policy downgrade" in str(refused.value) and "version 1" in str(refused.value)
    assert not older.opened and len(newer.opened) == 1


def test_attack4_downgrade_in_the_next_session_is_refused(gateway: OperatorGateway, tmp_path: Path) -> None:
    policy, newer, older = downgrade_world(gateway, tmp_path)
    gateway.shown = [newer]
    assert ask(sealed_openai(gateway, policy)).choices[0].message.content == "an answer"
    gateway.shown = [older]
    with pytest.raises(PolicyDowngrade):
        ask(sealed_openai(gateway, policy))  # a new session: the state file remembers version 2
    path = tmp_path / "client-policy.json"
    path.write_text(json.dumps(policy))
    from typer.testing import CliRunner

    from api.cli.main import build

    result = CliRunner().invoke(build(), ["verify", gateway.url, "--policy", str(path)])
    assert result.exit_code == 1 and "NOT verified (PolicyDowngrade)" in result.output, result.output
    with TestClient(create_proxy_app(f"{gateway.url}/v1", ClientTrust.from_dict(policy))) as local:
        answer = local.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-tenant"},
                            json={"model": MODEL, "messages": [{"role": "user", "content": CANARY}]})
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "PolicyDowngrade"
    assert not older.opened
