"""The README's quick start through a Python client generated from docs/openapi.json.

The client (`gpu_reservations_client`) is what openapi-python-client makes of the document,
used as generated: every call below is one of its typed functions, every answer one of its
models, refusals included (a `Problem`). Each response is also recorded, with the request
that got it, to a JSON file that scripts/client-test turns into TypeScript checked against
the types openapi-typescript generates.

    python quickstart.py BASE_URL OPERATOR_TOKEN RESPONSES_JSON

scripts/client-test runs it (and `mypy --strict` over it) against the served app.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import datetime, timezone
from typing import Any, TypeVar

import httpx

from gpu_reservations_client import AuthenticatedClient, Client
from gpu_reservations_client.api.audit import list_audit_events, verify_audit_chain
from gpu_reservations_client.api.capacity import reclaim_dry_run, reclaim_units, release_units
from gpu_reservations_client.api.identity import create_api_key, create_org, whoami
from gpu_reservations_client.api.meta import health
from gpu_reservations_client.api.nodes import list_market, put_node
from gpu_reservations_client.api.reservations import create_reservation, list_reservations
from gpu_reservations_client.api.vms import get_vm, place_vm
from gpu_reservations_client.models import (
    AuditEvent,
    AuditPage,
    ChainVerification,
    DryRunResult,
    Health,
    IssuedApiKey,
    MarketPage,
    NewApiKey,
    NewOrg,
    NewReservation,
    NewVm,
    NodeWrite,
    Org,
    Problem,
    PutNode,
    ReclaimRequest,
    ReclaimResult,
    ReleaseRequest,
    ReleaseResult,
    Reservation,
    ReservationPage,
    ReservationStatus,
    ReturnPreference,
    Role,
    Vm,
    VmStatus,
    VmTier,
    Whoami,
)
from gpu_reservations_client.types import UNSET, Response

T = TypeVar("T")

recorded: list[dict[str, Any]] = []


def record(response: httpx.Response) -> None:
    """Keeps every answer, with its request, for the TypeScript check."""
    response.read()
    recorded.append(
        {
            "method": response.request.method,
            "path": response.request.url.path,
            "status": response.status_code,
            "contentType": response.headers.get("content-type", ""),
            "body": response.json(),
        }
    )


def ok(response: Response[Any], status: int, kind: type[T]) -> T:
    """The answer's model, which must be a `kind` with this status."""
    assert response.status_code == status, (status, response.status_code, response.content)
    assert isinstance(response.parsed, kind), (kind, response.parsed)
    return response.parsed


def refused(response: Response[Any], status: int, code: str) -> Problem:
    """The answer's problem document, which must have this status and code."""
    assert response.status_code == status, (status, response.status_code, response.content)
    problem = response.parsed
    assert isinstance(problem, Problem), problem
    assert problem.status == status and problem.code == code, problem
    return problem


def main(base: str, operator_token: str, out: str) -> None:
    hooks = {"event_hooks": {"response": [record]}}

    def client(token: str) -> AuthenticatedClient:
        return AuthenticatedClient(base_url=base, token=token, httpx_args=hooks)

    # 0. Health, without a token.
    status = ok(health.sync_detailed(client=Client(base_url=base, httpx_args=hooks)), 200, Health)
    assert status.status == "ok"
    op = client(operator_token)

    # 1. Operator: four orgs (ids generated).
    def org(name: str) -> str:
        return ok(create_org.sync_detailed(client=op, body=NewOrg(name=name)), 201, Org).id

    owner, research, broker, buyer = (
        org(name) for name in ("Acme GPU Cloud", "Research Lab", "Capacity Broker", "Spot Buyer")
    )

    # 2. Operator: a key for each org; the token is in the response, once.
    def key(org_id: str, name: str, role: Role, idempotency_key: str | None = None) -> IssuedApiKey:
        response = create_api_key.sync_detailed(
            org_id,
            client=op,
            body=NewApiKey(name=name, role=role),
            idempotency_key=idempotency_key if idempotency_key else UNSET,
        )
        return ok(response, 201, IssuedApiKey)

    def token(issued: IssuedApiKey) -> str:
        assert isinstance(issued.token, str), issued
        return issued.token

    owner_key = client(token(key(owner, "owner ops", Role.CAPACITY_MANAGER)))
    research_key = client(token(key(research, "research jobs", Role.MEMBER)))
    broker_key = client(token(key(broker, "broker", Role.CAPACITY_MANAGER)))
    first = key(buyer, "buyer jobs", Role.MEMBER, idempotency_key="buyer-key-1")
    buyer_key = client(token(first))
    # A replayed creation answers the same key without its token, and says so.
    replay = key(buyer, "buyer jobs", Role.MEMBER, idempotency_key="buyer-key-1")
    assert replay.id == first.id and replay.token_withheld is True, replay
    me = ok(whoami.sync_detailed(client=owner_key), 200, Whoami)
    assert me.org_id == owner and not me.operator, me

    # 3. Operator: a node of the owner with four GPU units.
    node = f"node-{random.randrange(10**9)}"
    units = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    registered = put_node.sync_detailed(node, client=op, body=PutNode(owner_org_id=owner, unit_ids=units))
    assert ok(registered, 201, NodeWrite).unit_ids == units

    # 4. Owner key: three units reserved for the research org, managed by the broker.
    reservation = ok(
        create_reservation.sync_detailed(
            node,
            client=owner_key,
            body=NewReservation(
                reserved_unit_ids=units[:3],
                allowed_org_ids=[research],
                managing_org_ids=[broker],
                starts_at=datetime(2025, 1, 1, tzinfo=timezone.utc),
                ends_at=datetime(2099, 1, 1, tzinfo=timezone.utc),
                contract_ref="contract-42",
                reason="research quarter",
            ),
        ),
        201,
        Reservation,
    )
    assert reservation.status == ReservationStatus.ACTIVE, reservation
    rsv = reservation.id

    # The status filter with several values, sent the way the generated client sends a list.
    page = list_reservations.sync_detailed(
        node, client=owner_key, status=[ReservationStatus.ACTIVE, ReservationStatus.PENDING]
    )
    assert [r.id for r in ok(page, 200, ReservationPage).items] == [rsv]
    page = list_reservations.sync_detailed(node, client=owner_key, status=[ReservationStatus.CANCELLED])
    assert ok(page, 200, ReservationPage).items == []

    # A buyer is no party of the reservation: releasing it is a 404, as for none at all.
    refused(
        release_units.sync_detailed(node, rsv, client=buyer_key, body=ReleaseRequest(unit_ids=["gpu-1"])),
        404,
        "not-found",
    )

    # 5. Broker key (a managing org): two idle units to the spot market.
    released = release_units.sync_detailed(
        node, rsv, client=broker_key, body=ReleaseRequest(unit_ids=["gpu-1", "gpu-2"], reason="idle this week")
    )
    assert ok(released, 200, ReleaseResult).released_unit_ids == ["gpu-1", "gpu-2"]

    # 6. Buyer key: what is for sale.
    offers = ok(list_market.sync_detailed(client=buyer_key, node_id=node), 200, MarketPage).items
    assert sorted(o.unit_id for o in offers) == ["gpu-1", "gpu-2"], offers
    unit = offers[0].unit_id

    # 7. Buyer key: a spot VM on that unit; a community VM there is refused.
    refused(
        place_vm.sync_detailed(client=buyer_key, body=NewVm(node_id=node, unit_ids=[unit], tier=VmTier.COMMUNITY)),
        409,
        "placement-refused",
    )
    spot_vm = ok(
        place_vm.sync_detailed(client=buyer_key, body=NewVm(node_id=node, unit_ids=[unit], tier=VmTier.SPOT)),
        201,
        Vm,
    )
    offers = ok(list_market.sync_detailed(client=buyer_key, node_id=node), 200, MarketPage).items
    assert unit not in [o.unit_id for o in offers], offers

    # 8. Research key (the audience): a community VM on a reserved, unreleased unit. Its
    #    tier is the one a VM reports: the same type a placement takes.
    community_vm = ok(
        place_vm.sync_detailed(client=research_key, body=NewVm(node_id=node, unit_ids=["gpu-0"], tier=VmTier.COMMUNITY)),
        201,
        Vm,
    )
    again = NewVm(node_id=node, unit_ids=["gpu-0"], tier=community_vm.tier)
    refused(place_vm.sync_detailed(client=research_key, body=again), 409, "placement-refused")

    # 9. Owner key: what would reclaiming both units do? (Writes nothing.)
    dry_run = ok(
        reclaim_dry_run.sync_detailed(
            node, rsv, client=owner_key, body=ReclaimRequest(unit_ids=[unit, "gpu-0"]), prefer=ReturnPreference.RETURNMINIMAL
        ),
        200,
        DryRunResult,
    )
    assert (dry_run.would_terminate, dry_run.would_skip) == ([spot_vm.id], [community_vm.id]), dry_run

    # 10. Owner key: reclaim. The spot VM is terminated, the community VM left running.
    reclaimed = ok(
        reclaim_units.sync_detailed(
            node, rsv, client=owner_key, body=ReclaimRequest(unit_ids=[unit, "gpu-0"], reason="training starts")
        ),
        200,
        ReclaimResult,
    )
    assert (reclaimed.terminated, reclaimed.skipped) == ([spot_vm.id], [community_vm.id]), reclaimed
    stopped = ok(get_vm.sync_detailed(spot_vm.id, client=buyer_key), 200, Vm)
    assert stopped.status == VmStatus.TERMINATED, stopped

    # 11. Owner key: the audit trail of the node. Actions are an open set: a client keeps
    #     the ones it does not know as plain strings.
    events = ok(list_audit_events.sync_detailed(client=owner_key, node_id=node), 200, AuditPage).items
    actions = [str(e.action) for e in events if isinstance(e, AuditEvent)]
    assert "reservation.release" in actions and "reservation.reclaim" in actions, actions

    # 12. Operator: verify the audit chain.
    verification = ok(verify_audit_chain.sync_detailed(client=op), 200, ChainVerification)
    assert verification.ok, verification

    with open(out, "w") as f:
        json.dump(recorded, f, indent=1)
    print(f"the quick start ran through the generated client: {len(recorded)} responses recorded")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
