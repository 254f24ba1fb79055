"""Runs a user can find: tags edited on the run page (CSRF-checked, bad tags refused naming the
field, nothing half-written) and the runs list's search and tag filters, on the page and the API."""

from __future__ import annotations

from tests.ui.factories import csrf_token


def test_tags_are_edited_with_csrf_and_bad_ones_are_refused_keeping_the_old(client, lab) -> None:
    run = lab["ddp2"].id
    token = csrf_token(client)
    assert client.post(f"/runs/{run}/tags", data={"tags": "x"}, follow_redirects=False).status_code == 403
    saved = client.post(f"/runs/{run}/tags", data={"csrf_token": token, "tags": "study-a, study-b, study-a"}, follow_redirects=False)
    assert saved.status_code == 303
    page = client.get(f"/runs/{run}").text
    assert 'href="/?tag=study-a"' in page and 'href="/?tag=study-b"' in page
    refused = client.post(f"/runs/{run}/tags", data={"csrf_token": token, "tags": "ok, " + "y" * 65})
    assert refused.status_code == 422 and "tags: tag" in refused.text and "at most 64 characters" in refused.text
    many = client.post(f"/runs/{run}/tags", data={"csrf_token": token, "tags": ",".join(f"t{i}" for i in range(21))})
    assert many.status_code == 422 and "at most 20 tags" in many.text
    assert client.get("/api/v1/runs", params={"tag": "study-a"}).json()["items"][0]["id"] == run, "the old tags stand"


def test_the_list_filters_by_tag_and_search_on_the_page_and_the_api(client, lab) -> None:
    run = lab["fsdp2"]
    token = csrf_token(client)
    client.post(f"/runs/{run.id}/tags", data={"csrf_token": token, "tags": "find-me"})
    api = client.get("/api/v1/runs", params={"tag": "find-me"}).json()["items"]
    assert [r["id"] for r in api] == [run.id]
    by_id = client.get("/api/v1/runs", params={"q": run.id[:10]}).json()["items"]
    assert [r["id"] for r in by_id] == [run.id]
    assert client.get("/api/v1/runs", params={"q": "100%_"}).json()["items"] == [], "LIKE's wildcards are matched literally"
    page = client.get("/", params={"tag": "find-me"}).text
    assert f'href="/runs/{run.id}"' in page and page.count('class="compare-tick"') == 1
    refused = client.get("/", params={"status": "bogus"})
    assert refused.status_code == 422
    assert client.get("/", params={"q": "x" * 201}).status_code == 422
