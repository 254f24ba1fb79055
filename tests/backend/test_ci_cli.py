"""`parallab upload --fail-on-change`, `parallab series accept` and `parallab ci report` against a real
server (uvicorn on a loopback port): a planted bytes change fails the job with exit 4, an accepted
one does not, the report is printed only when something changed."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from parallab.cli import app
from tests.backend.ci_documents import document
from tests.backend.test_exact_gates import _bytes, with_counters
from tests.backend.test_series import member
from tests.backend.test_upload_cli_retries import served

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "300"})
    return result.exit_code, " ".join((result.stdout + result.stderr).split())


def test_a_planted_change_fails_the_job_until_it_is_accepted(settings, tmp_path: Path) -> None:
    bearer = member(settings, "ada@lab.org")["Authorization"].removeprefix("Bearer ")
    base, planted = tmp_path / "base.json", tmp_path / "planted.json"
    base.write_text(json.dumps(with_counters(document(commit="eeee001"))))
    changed = with_counters(document(commit="eeee002"))
    _bytes(changed)
    planted.write_text(json.dumps(changed))
    ids = tmp_path / "series.txt"
    with served(settings) as server:
        auth = ("--server", server.url, "--token", bearer)
        assert run("upload", str(base), *auth, "--fail-on-change", "bytes,memory")[0] == 0
        code, out = run("upload", str(planted), *auth, "--fail-on-change", "bytes,memory", "--series-file", str(ids))
        assert code == 4 and "comm.all_reduce.g2.bytes" in out and "+50.0%" in out, out
        sid = ids.read_text().strip()
        code, markdown = run("ci", "report", sid, "--server", server.url, "--if-changed")
        assert code == 0 and "something changed" in markdown and "`comm.all_reduce.g2.bytes`" in markdown, markdown
        # the same file again is a replay (same Idempotency-Key): the first answer, judged by the flags given now
        assert run("upload", str(planted), *auth, "--fail-on-change", "params")[0] == 0, "another category"
        code, out = run("upload", str(planted), *auth, "--fail-on-change", "bytes,speed")
        assert code == 2 and "--fail-on-change" in out and "speed" in out, out
        assert run("upload", str(planted), *auth, "--fail-on-change", "bytes")[0] == 4
        code, out = run("series", "accept", sid, "bytes", *auth)
        assert code == 0 and "accepted comm.all_reduce.g2.bytes: 2000 → 3000" in out, out
        code, out = run("upload", str(planted), *auth, "--fail-on-change", "all")
        assert code == 0 and "accepted" in out, "an accepted change no longer fails the job"
        code, out = run("ci", "report", sid, "--server", server.url, "--if-changed")
        assert code == 0 and "nothing changed" in out and "parallab:" not in out, out
        code, out = run("ci", "report", sid, "--server", server.url, "--json")
        assert code == 0 and '"changed": false' in out
        code, out = run("ci", "report", "no-such-series", "--server", server.url)
        assert code == 2 and "no-such-series" in out, out


def test_the_report_of_a_shared_server_is_read_with_a_token(settings, tmp_path: Path) -> None:
    settings.security.allow_local_mode = False  # a lab's shared server: no API call without a session or a token
    settings.security.secret_key = "ci-report-secret"  # which such a server must have
    bearer = member(settings, "grace@lab.org")["Authorization"].removeprefix("Bearer ")
    path, ids = tmp_path / "result.json", tmp_path / "series.txt"
    path.write_text(json.dumps(with_counters(document(commit="ffff001"))))
    with served(settings) as server:
        assert run("upload", str(path), "--server", server.url, "--token", bearer, "--series-file", str(ids))[0] == 0
        sid = ids.read_text().strip()
        code, out = run("ci", "report", sid, "--server", server.url)
        assert code == 3 and "401" in out, out
        code, out = run("ci", "report", sid, "--server", server.url, "--token", bearer, "--json")
        assert code == 0 and '"changed": false' in out, out


def test_fail_on_change_timing_reads_the_normalised_metric_unless_asked_for_raw(settings, tmp_path: Path) -> None:
    import httpx

    from tests.backend.test_host_speed_series import probed

    bearer = member(settings, "ada@lab.org")["Authorization"].removeprefix("Bearer ")
    docs = []
    for i in range(20):
        host = 0.6 if i >= 15 else 1.0  # from job 15 the runner is loaded: the job and the probe slow alike
        docs.append(probed(document(tokens_per_s=1000.0 * host * (1 + 0.02 * (-1) ** i), commit=f"{i:07x}"), 2e7 * host))
    last = tmp_path / "last.json"
    last.write_text(json.dumps(docs[-1]))
    with served(settings) as server:
        for doc in docs[:-1]:
            answer = httpx.post(f"{server.url}/api/v1/results", json=doc, headers={"Authorization": f"Bearer {bearer}"}, timeout=60)
            assert answer.status_code == 201, answer.text
        auth = ("--server", server.url, "--token", bearer)
        code, out = run("upload", str(last), *auth, "--fail-on-change", "bytes,timing")
        assert code == 0, f"auto: every job probed, the normalised throughput did not change: {out}"
        code, out = run("upload", str(last), *auth, "--fail-on-change", "timing", "--timing-basis", "raw")
        assert code == 4 and "tokens_per_s (raw): -4" in out and "000000f" in out, out
        assert run("upload", str(last), *auth, "--fail-on-change", "bytes", "--timing-basis", "raw")[0] == 0, "timing not named"
        code, out = run("upload", str(last), *auth, "--fail-on-change", "timing", "--timing-basis", "normal")
        assert code == 2 and "--timing-basis" in out and "'normal'" in out, out
        ids = tmp_path / "series.txt"
        run("upload", str(last), *auth, "--series-file", str(ids))
        code, markdown = run("ci", "report", ids.read_text().strip(), "--server", server.url, "--basis", "raw")
        assert code == 0 and "something changed" in markdown and "The verdict reads the **raw** throughput" in markdown, markdown
        code, out = run("ci", "report", ids.read_text().strip(), "--server", server.url, "--if-changed")
        assert code == 0 and "nothing changed" in out, "auto reads the normalised metrics: the host's slowdown is no change"
