"""``GATEWAY_REDIS_URL=redis+cluster://...`` on a real 3-master Redis Cluster
(``redis-server --cluster-enabled`` and ``redis-cli --cluster create``): keys, limits,
concurrency leases, sessions and usage work with keys spread over every node, limits stay
exact, and a node that dies makes its keys' requests fail closed with 503."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gateway.backend.fake import FakeBackend
from tests.support.bodies import chat_body, sse_json
from tests.support.inprocess import AUTH, bearer, make_settings, serve
from tests.support.redis_server import Cluster

# A three-master Redis Cluster: handed out with the long groups (tests/conftest.py).
pytestmark = pytest.mark.long

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield nodes
    finally:
        nodes.stop()


async def test_everything_works_over_a_cluster_with_exact_limits(cluster: Cluster) -> None:
    fake = FakeBackend()
    settings = make_settings(redis_url=cluster.url, concurrency_lease_s=0.3)
    async with serve(settings, fake) as (_, http, _sdk):
        made = [
            (await http.post("/admin/keys", json={"name": f"k{i}", "rpm": 3}, headers=AUTH)).json()
            for i in range(8)
        ]
        # The keys' records really are on different nodes.
        assert len({cluster.node_of(f"gw:key:{{{k['id']}}}") for k in made}) >= 2
        listed = (await http.get("/admin/keys", headers=AUTH)).json()["data"]
        assert {k["id"] for k in made} <= {k["id"] for k in listed}
        for key in made:  # each key: exactly rpm requests, then 429
            codes = [
                (await http.post(CHAT, json=chat_body(), headers=bearer(key["key"]))).status_code
                for _ in range(4)
            ]
            assert codes == [200, 200, 200, 429], codes
        usage = (await http.get(f"/admin/keys/{made[0]['id']}/usage", headers=AUTH)).json()
        assert usage["requests"] == 3
        revoked = await http.delete(f"/admin/keys/{made[1]['id']}", headers=AUTH)
        assert revoked.status_code == 200
        refused = await http.post(CHAT, json=chat_body(), headers=bearer(made[1]["key"]))
        assert refused.status_code == 401
        # The audit log (one stream: one slot) holds every change.
        audit = (await http.get("/admin/audit", headers=AUTH)).json()["data"]
        assert (audit[0]["action"], audit[0]["target"]) == ("key.revoke", made[1]["id"])

        # A concurrency lease, renewed while its stream outlives the lease length.
        single = (
            await http.post("/admin/keys", json={"name": "one", "max_concurrency": 1}, headers=AUTH)
        ).json()["key"]
        fake.token_delay_s = 0.1
        fake.reply = " ".join(["w"] * 10)
        slow = asyncio.create_task(  # the fake waits between streamed tokens only
            http.post(CHAT, json=chat_body(stream=True), headers=bearer(single), timeout=30)
        )
        await asyncio.sleep(0.6)  # two lease lengths: only renewal keeps it held
        second = await http.post(CHAT, json=chat_body(), headers=bearer(single))
        assert second.status_code == 429, second.text
        assert (await slow).status_code == 200
        fake.token_delay_s = 0.0
        assert (await http.post(CHAT, json=chat_body(), headers=bearer(single))).status_code == 200

        # Sessions (WATCH/MULTI on one key) keep their turns.
        for text in ("My name is Ann.", "What is my name?"):
            body = chat_body(messages=[{"role": "user", "content": text}])
            said = await http.post(CHAT, json=body, headers={**AUTH, "X-Session-ID": "c1"})
            assert said.status_code == 200
        assert "My name is Ann." in fake.calls[-1].prompt
        stored = (await http.get("/v1/sessions/c1", headers=AUTH)).json()
        assert len(stored["messages"]) == 4


async def test_budgets_hold_exactly_over_a_cluster_across_two_replicas(cluster: Cluster) -> None:
    fake = FakeBackend()
    fake.reply = " ".join(f"w{i}" for i in range(20))
    fake.token_delay_s = 0.02  # all still run when the last is admitted
    settings = make_settings(redis_url=cluster.url)
    async with serve(settings, fake) as (_, first, _), serve(settings, fake) as (_, second, _):
        key = (await first.post("/admin/keys", json={"name": "b"}, headers=AUTH)).json()
        node = cluster.node_of(f"gw:key:{{{key['id']}}}")
        # A project whose records live on another node than the key's.
        project = next(
            f"p{i}" for i in range(100) if cluster.node_of(f"gw:project:{{p{i}}}") != node
        )
        budget = {"tokens_per_day": 600}
        made = await first.post("/admin/projects", json={"id": project, "budget": budget})
        assert made.status_code == 201, made.text
        patch = {"project": project, "budget": {"tokens_per_month": 10_000}}
        assert (await first.patch(f"/admin/keys/{key['id']}", json=patch)).status_code == 200
        body = chat_body(max_tokens=40, stream=True, stream_options={"include_usage": True})
        replies = await asyncio.gather(
            *(
                (first, second)[i % 2].post(CHAT, json=body, headers=bearer(key["key"]))
                for i in range(16)
            )
        )
        codes = sorted(r.status_code for r in replies)
        bound = len(fake.calls[0].prompt.encode()) + 1
        admitted = 600 // (bound + 40)
        assert codes == [200] * admitted + [429] * (16 - admitted), codes
        # Refused for what the running ones held (the SDKs retry it), naming the project.
        refused = next(r for r in replies if r.status_code == 429)
        assert refused.json()["error"]["code"] == "budget_held"
        assert f"project '{project}'" in refused.json()["error"]["message"]
        spent = sum(
            e["usage"]["total_tokens"]
            for r in replies
            if r.status_code == 200
            for e in sse_json(r.text)
            if e.get("usage")
        )
        me = (await second.get("/v1/me", headers=bearer(key["key"]))).json()
        uses = {(b["scope"], b["budget"]): b["used"] for b in me["budgets"]}
        assert uses == {("project", "tokens_per_day"): spent, ("key", "tokens_per_month"): spent}
        assert spent <= 600


async def test_files_over_a_cluster(cluster: Cluster) -> None:
    """A file's record, indexes and 1 MiB pieces share its key's slot; binary bytes come
    back as they went (the client decodes text answers)."""
    data = bytes(range(256)) * 4096 * 2 + b"end"  # three pieces
    async with serve(make_settings(redis_url=cluster.url)) as (_, _http, sdk):
        made = await sdk.files.create(file=("a.bin", data), purpose="user_data")
        assert [f.id for f in (await sdk.files.list()).data] == [made.id]
        assert (await sdk.files.content(made.id)).content == data
        assert (await sdk.files.delete(made.id)).deleted


async def test_a_dead_node_fails_its_keys_closed(cluster: Cluster) -> None:
    async with serve(make_settings(redis_url=cluster.url)) as (_, http, _sdk):
        made = [
            (await http.post("/admin/keys", json={"name": f"d{i}"}, headers=AUTH)).json()
            for i in range(24)
        ]
        victim = cluster.ports[2]
        on_victim = [k for k in made if cluster.node_of(f"gw:key:{{{k['id']}}}") == victim]
        assert on_victim, "no key landed on the third node"
        cluster.processes[victim].kill()
        cluster.processes[victim].wait()
        response = await http.post(CHAT, json=chat_body(), headers=bearer(on_victim[0]["key"]))
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "store_unavailable"
        assert response.headers["retry-after"]
