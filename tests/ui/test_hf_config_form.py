"""The form's "paste a config.json" box: a pasted config is the model (the stored run holds the
explicit fields it stands for); a bad one comes back beside the box naming its key, and nothing
is stored."""

from __future__ import annotations

import json

from backend.models import Run
from tests.core.hf_configs import TINY_LLAMA, nested
from tests.ui.factories import csrf_token
from tests.ui.test_pages import count_runs


def block(html: str, field: str) -> str:
    """The form's block of one field (its errors included)."""
    start = html.index(f'data-field="{field}"')
    return html[start : start + 3000]


def test_the_form_has_a_config_box_and_a_pasted_config_is_the_model(client, session_factory):
    html = client.get("/runs/new").text
    assert '<textarea id="f-hf_config" name="hf_config"' in html and "Paste a config.json" in html
    token = csrf_token(client)
    job = {"csrf_token": token, "model": "tiny", "strategy": "fsdp", "world_size": "2", "steps": "3"}
    r = client.post("/runs/new", data={**job, "hf_config": json.dumps(TINY_LLAMA, indent=2)}, follow_redirects=False)
    assert r.status_code == 303, r.text[:3000]
    run_id = r.headers["location"].rsplit("/", 1)[-1]
    with session_factory() as s:
        workload = s.get(Run, run_id).spec["workload"]
    assert "hf_config" not in workload
    assert (workload["family"], workload["num_layers"], workload["num_kv_heads"], workload["vocab_size"]) == ("hf", 2, 2, 256)
    # a shape field filled in beside the config overrides it
    live = client.get(
        "/runs/new/plan.json",
        params={"model": "tiny", "strategy": "fsdp", "world_size": "2", "hf_config": json.dumps(TINY_LLAMA), "num_layers": "3"},
    ).json()
    assert live["ok"] is True, live["errors"]


def test_a_bad_config_is_named_beside_the_box_and_nothing_is_stored(client, session_factory):
    token = csrf_token(client)
    job = {"csrf_token": token, "model": "tiny", "strategy": "fsdp", "world_size": "2", "steps": "3"}
    before = count_runs(session_factory)
    refused = [
        ({**TINY_LLAMA, "num_hidden_layers": 10**6}, "num_hidden_layers: num_layers 1000000: Input should be less than or equal to 1024"),
        ({**TINY_LLAMA, "model_type": "gpt2"}, "model_type: model_type &#34;gpt2&#34;: the hf family builds llama, mistral, qwen2"),
        ({**TINY_LLAMA, "num_key_value_heads": 3}, "num_key_value_heads: num_heads 4 is not divisible by num_kv_heads 3"),
        ({**TINY_LLAMA, "rope_scaling": nested(40)}, "rope_scaling: nested deeper than 32 levels"),
        ('{"model_type": "llama",', "not JSON"),
    ]
    for config, words in refused:
        text = config if isinstance(config, str) else json.dumps(config)
        r = client.post("/runs/new", data={**job, "hf_config": text})
        assert r.status_code == 422, config
        assert words in block(r.text, "hf_config"), (words, block(r.text, "hf_config"))
        assert 'id="f-hf_config"' in r.text and "<details open" in r.text  # the box stays open, the text in it
    assert count_runs(session_factory) == before
    live = client.get(
        "/runs/new/plan.json",
        params={"model": "tiny", "strategy": "fsdp", "world_size": "2", "hf_config": json.dumps({**TINY_LLAMA, "model_type": "bloom"})},
    ).json()
    assert live["ok"] is False and "model_type" in live["errors"]["hf_config"][0]
