"""/watch.json, what pages that wait for runs poll: each run's state in one query, unknown ids named,
too many refused on the field."""

from __future__ import annotations

from backend.services.runs import WATCH_MAX


def test_watch_gives_each_runs_state_and_names_the_unknown(client, lab) -> None:
    ids = [lab["ddp2"].id, "no-such-run", lab["fsdp2"].id]
    body = client.get("/watch.json", params={"ids": ",".join(ids)}).json()
    assert [r["id"] for r in body["runs"]] == [ids[0], ids[2]] and body["missing"] == ["no-such-run"]
    assert all(r["status"] == "succeeded" and r["finished"] for r in body["runs"])


def test_watch_refuses_more_runs_than_it_polls_naming_the_field(client) -> None:
    response = client.get("/watch.json", params={"ids": ",".join(f"r{i}" for i in range(WATCH_MAX + 1))})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", "ids"]
    assert f"at most {WATCH_MAX}" in response.json()["detail"][0]["msg"]
