"""The CLI of accounts (issue #11): `parallab user`, `parallab token`, and what `parallab upload` does
before it reaches a server (CI metadata from the environment, bad input, an unreachable server)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from backend.config import get_settings
from backend.db import session_scope
from backend.models import ApiToken, User
from parallab.cli import app
from parallab.commands.ci_env import ci_metadata
from parallab.commands.upload import EXIT_SERVER, with_source
from tests.backend.ci_documents import document


@pytest.fixture
def cli(settings, monkeypatch) -> Iterator[CliRunner]:
    """A runner whose commands see the test database (through the settings, as in production)."""
    monkeypatch.setenv("PARALLAB_DATABASE_URL", settings.sqlalchemy_url)
    monkeypatch.setenv("PARALLAB_HOME", str(settings.resolved_home))
    monkeypatch.setenv("COLUMNS", "200")  # rich tables unwrapped
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def test_the_first_admin_then_a_member_then_a_token_from_the_command_line(cli, settings) -> None:
    made = cli.invoke(app, ["user", "create", "Root@Lab.org", "--admin", "--password-stdin"], input="first-admin-pw\n")
    assert made.exit_code == 0, made.output
    assert cli.invoke(app, ["user", "create", "ada@lab.org", "--password-stdin"], input="member-password\n").exit_code == 0
    listed = cli.invoke(app, ["user", "list"])
    assert "root@lab.org" in listed.output and "admin" in listed.output and "ada@lab.org" in listed.output

    created = cli.invoke(app, ["token", "create", "--user", "ada@lab.org", "--scope", "upload", "--name", "ci"])
    assert created.exit_code == 0, created.output
    plain = created.output.strip()
    assert plain.startswith("plb_")
    with session_scope(settings.sqlalchemy_url) as session:
        row, owner = session.execute(select(ApiToken, User).join(User, User.id == ApiToken.user_id)).one()
        assert owner.email == "ada@lab.org" and row.scopes == "upload" and plain not in row.token_hash
        token_id = row.id
    assert "ada@lab.org" in cli.invoke(app, ["token", "list", "--user", "ada@lab.org"]).output
    assert cli.invoke(app, ["token", "revoke", str(token_id)]).exit_code == 0
    assert "revoked" in cli.invoke(app, ["token", "list"]).output

    disabled = cli.invoke(app, ["user", "disable", "ada@lab.org"])
    assert disabled.exit_code == 0 and "disabled" in cli.invoke(app, ["user", "list"]).output


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["user", "create", "not-an-email", "--password-stdin"], "long-enough-pw\n", "email"),
        (["user", "create", "a@lab.org", "--password-stdin"], "short\n", "password"),
        (["user", "create", "a@lab.org", "--role", "boss", "--password-stdin"], "long-enough-pw\n", "role"),
        (["token", "create", "--user", "nobody@lab.org", "--scope", "upload"], "", "--user"),
        (["user", "disable", "nobody@lab.org"], "", "no user"),
    ],
)
def test_bad_input_exits_2_naming_the_field(cli, args, stdin, message) -> None:
    result = cli.invoke(app, args, input=stdin)
    assert result.exit_code == 2 and message in result.output


def test_a_member_cannot_be_given_the_admin_scope(cli) -> None:
    cli.invoke(app, ["user", "create", "ada@lab.org", "--password-stdin"], input="member-password\n")
    result = cli.invoke(app, ["token", "create", "--user", "ada@lab.org", "--scope", "admin"])
    assert result.exit_code == 2 and "--scope" in result.output and "cannot hold the admin scope" in result.output


def test_ci_metadata_comes_from_github_actions_and_gitlab_ci() -> None:
    github = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_REPOSITORY": "lab/model",
        "GITHUB_SHA": "0123456789abcdef0123456789abcdef01234567",
        "GITHUB_REF": "refs/pull/42/merge",
        "GITHUB_REF_NAME": "42/merge",
        "GITHUB_HEAD_REF": "feature/faster",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_RUN_ID": "777",
        "GITHUB_RUN_ATTEMPT": "2",
    }
    assert ci_metadata(github) == {
        "repository": "lab/model",
        "branch": "feature/faster",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "pr": 42,
        "ci_url": "https://github.com/lab/model/actions/runs/777/attempts/2",
    }
    push = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_REF": "refs/heads/main",
        "GITHUB_REF_NAME": "main",
        "GITHUB_REF_TYPE": "branch",
        "GITHUB_HEAD_REF": "",
    }
    assert ci_metadata(push)["branch"] == "main" and ci_metadata(push)["pr"] is None
    gitlab = {
        "GITLAB_CI": "true",
        "CI_PROJECT_PATH": "lab/model",
        "CI_COMMIT_SHA": "abcdef1",
        "CI_COMMIT_REF_NAME": "main",
        "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME": "feature/x",
        "CI_MERGE_REQUEST_IID": "9",
        "CI_JOB_URL": "https://gitlab.example/lab/model/-/jobs/5",
    }
    assert ci_metadata(gitlab) == {
        "repository": "lab/model",
        "branch": "feature/x",
        "commit": "abcdef1",
        "pr": 9,
        "ci_url": "https://gitlab.example/lab/model/-/jobs/5",
    }
    assert set(ci_metadata({}).values()) == {None}


def test_flags_and_ci_metadata_are_laid_over_the_documents_source() -> None:
    doc = document(branch="main", commit="aaaa111")
    out = with_source(doc, {"branch": "feature", "commit": None, "pr": 3})
    assert out["source"] == {**doc["source"], "branch": "feature", "pr": 3}
    assert doc["source"]["branch"] == "main", "the caller's document is left alone"


def test_upload_exit_codes_before_any_server_answers(cli, tmp_path) -> None:
    good = tmp_path / "result.json"
    good.write_text(json.dumps(document()))
    not_json = tmp_path / "broken.json"
    not_json.write_text("{ nope")
    a_list = tmp_path / "list.json"
    a_list.write_text("[]")
    base = ["upload", "--server", "http://127.0.0.1:9", "--token", "plb_x"]
    assert cli.invoke(app, [*base[:1], str(not_json), *base[1:]]).exit_code == 2
    assert cli.invoke(app, [*base[:1], str(a_list), *base[1:]]).exit_code == 2
    assert cli.invoke(app, [*base[:1], str(tmp_path / "missing.json"), *base[1:]]).exit_code == 2
    # One retry: the backoff through the default six is test_upload_cli_retries's subject, not this one's.
    unreachable = cli.invoke(app, [*base[:1], str(good), *base[1:], "--retries", "1"])
    assert unreachable.exit_code == EXIT_SERVER and "could not reach" in unreachable.output
