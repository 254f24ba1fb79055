"""Accounts (issue #11): users, argon2 passwords, login sessions, owned tokens with scopes and last use."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import SecretStr
from sqlalchemy import select

from backend.db import session_scope
from backend.models import ApiToken, LoginSession, User, utcnow
from backend.services import auth, tokens
from backend.services.auth import AccountError, LoginFailed


def make_user(settings, email: str, role: str, password: str = "correct horse battery") -> User:
    with session_scope(settings.sqlalchemy_url) as session:
        return auth.create_user(session=session, email=email, password=password, role=role)


def test_passwords_are_stored_as_argon2id_hashes_and_verified(settings) -> None:
    make_user(settings, "Ada@Lab.org", "member")
    with session_scope(settings.sqlalchemy_url) as session:
        user = session.execute(select(User)).scalar_one()
        assert user.email == "ada@lab.org", "emails are lower-cased"
        assert user.password_hash.startswith("$argon2id$") and "correct horse" not in user.password_hash
        assert auth.authenticate(session=session, email="ADA@lab.org", password="correct horse battery").id == user.id
        assert user.last_login_at is not None
        with pytest.raises(LoginFailed):
            auth.authenticate(session=session, email="ada@lab.org", password="wrong password")
        with pytest.raises(LoginFailed):
            auth.authenticate(session=session, email="nobody@lab.org", password="correct horse battery")


@pytest.mark.parametrize(
    ("email", "password", "role", "field"),
    [
        ("not-an-email", "long enough pw", "member", "email"),
        ("a@b.org", "short", "member", "password"),
        ("a@b.org", "long enough pw", "owner", "role"),
    ],
)
def test_bad_accounts_are_refused_naming_the_field(settings, email, password, role, field) -> None:
    with session_scope(settings.sqlalchemy_url) as session, pytest.raises(AccountError) as caught:
        auth.create_user(session=session, email=email, password=password, role=role)
    assert caught.value.field == field


def test_an_email_has_one_account(settings) -> None:
    make_user(settings, "bo@lab.org", "viewer")
    with pytest.raises(AccountError, match="already has an account"):
        make_user(settings, "BO@lab.org", "admin")


def test_a_session_lasts_until_logout_expiry_or_disabling(settings) -> None:
    make_user(settings, "cy@lab.org", "member")
    with session_scope(settings.sqlalchemy_url) as session:
        user = auth.find_user(session=session, email="cy@lab.org")
        cookie = auth.start_session(session=session, user=user, max_age_s=3600)
    with session_scope(settings.sqlalchemy_url) as session:
        stored = session.execute(select(LoginSession.id_hash)).scalar_one()
        assert cookie not in stored, "only the cookie's hash is stored"
        principal = auth.session_principal(session=session, cookie=cookie)
        assert principal is not None and principal.role == "member" and principal.email == "cy@lab.org"
        assert auth.session_principal(session=session, cookie=cookie, now=utcnow() + timedelta(hours=2)) is None, "expired"
        auth.end_session(session=session, cookie=cookie)
    with session_scope(settings.sqlalchemy_url) as session:
        assert auth.session_principal(session=session, cookie=cookie) is None
        user = auth.find_user(session=session, email="cy@lab.org")
        again = auth.start_session(session=session, user=user, max_age_s=3600)
        auth.set_disabled(session=session, user=user, disabled=True)
    with session_scope(settings.sqlalchemy_url) as session:
        assert auth.session_principal(session=session, cookie=again) is None
        with pytest.raises(LoginFailed):
            auth.authenticate(session=session, email="cy@lab.org", password="correct horse battery")


def test_roles_and_scopes_decide_each_action() -> None:
    viewer = auth.Principal(via="session", role="viewer", user_id=1)
    member = auth.Principal(via="session", role="member", user_id=2)
    upload_token = auth.Principal(via="token", role="member", user_id=2, scopes=frozenset({"upload"}))
    admin_token = auth.Principal(via="token", role="admin", user_id=3, scopes=frozenset({"admin"}))
    assert viewer.may("read") and not viewer.may("submit") and not viewer.may("upload")
    assert member.may("submit") and member.may("cancel") and not member.may("admin")
    assert upload_token.may("upload") and not upload_token.may("submit"), "a token acts only within its scopes"
    assert admin_token.may("submit") and admin_token.may("upload") and admin_token.may("admin")
    assert member.owns(2) and not member.owns(3) and admin_token.owns(2) and auth.LOCAL.owns(None)
    assert not auth.ANONYMOUS.may("read")
    with pytest.raises(auth.Forbidden, match="'submit' scope"):
        auth.require(upload_token, "submit")
    with pytest.raises(auth.Forbidden, match="member role"):
        auth.require(viewer, "submit")


def test_a_token_belongs_to_a_user_within_its_role_and_records_its_last_use(settings) -> None:
    make_user(settings, "dee@lab.org", "member")
    make_user(settings, "eve@lab.org", "viewer")
    with session_scope(settings.sqlalchemy_url) as session:
        member = auth.find_user(session=session, email="dee@lab.org")
        viewer = auth.find_user(session=session, email="eve@lab.org")
        plain = tokens.create_token(session=session, name="ci", scopes=["upload"], user=member)
        with pytest.raises(ValueError, match="cannot hold the admin scope"):
            tokens.create_token(session=session, name="x", scopes=["admin"], user=member)
        with pytest.raises(ValueError, match="cannot hold the upload scope"):
            tokens.create_token(session=session, name="x", scopes=["upload"], user=viewer)
    with session_scope(settings.sqlalchemy_url) as session:
        row = session.execute(select(ApiToken)).scalar_one()
        assert row.last_used_at is None and row.prefix == plain[:10] and plain not in row.token_hash
        principal = tokens.token_principal(session=session, token=plain)
        assert (principal.email, principal.role, principal.scopes) == ("dee@lab.org", "member", frozenset({"upload"}))
    with session_scope(settings.sqlalchemy_url) as session:
        assert session.execute(select(ApiToken.last_used_at)).scalar_one() is not None, "the use is recorded"
        listed = tokens.list_tokens(session=session, user_id=member.id)
        assert [(t.name, t.owner, t.scopes) for t in listed] == [("ci", "dee@lab.org", ["upload"])]
        auth.set_disabled(session=session, user=auth.find_user(session=session, email="dee@lab.org"), disabled=True)
    with session_scope(settings.sqlalchemy_url) as session, pytest.raises(tokens.TokenError, match="disabled"):
        tokens.token_principal(session=session, token=plain)


def test_only_its_owner_or_an_admin_revokes_a_token(settings) -> None:
    make_user(settings, "fay@lab.org", "member")
    with session_scope(settings.sqlalchemy_url) as session:
        fay = auth.find_user(session=session, email="fay@lab.org")
        plain = tokens.create_token(session=session, name="ci", scopes=["upload"], user=fay)
        token_id = session.execute(select(ApiToken.id)).scalar_one()
        other = auth.Principal(via="session", role="member", user_id=fay.id + 100)
        with pytest.raises(LookupError, match=f"no token {token_id} of yours"):  # as a missing one: nothing leaks
            tokens.revoke_token(session=session, token_id=token_id, principal=other)
        owner = auth.Principal(via="session", role="member", user_id=fay.id)
        assert tokens.revoke_token(session=session, token_id=token_id, principal=owner).revoked
    with session_scope(settings.sqlalchemy_url) as session, pytest.raises(tokens.TokenError, match="not valid"):
        tokens.token_principal(session=session, token=plain)


def test_the_env_seeded_admin_is_created_once_at_start_up(settings) -> None:
    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.config import get_settings

    seeded = settings.model_copy(update={"admin_email": "root@lab.org", "admin_password": SecretStr("seeded-password-1")})
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: seeded
    for _ in range(2):  # a restart keeps the one admin (and never resets its password)
        with TestClient(app):
            pass
    with session_scope(settings.sqlalchemy_url) as session:
        users = auth.list_users(session=session)
        assert [(u.email, u.role) for u in users] == [("root@lab.org", "admin")]
        assert auth.authenticate(session=session, email="root@lab.org", password="seeded-password-1")


def test_each_scope_needs_the_role_its_actions_need() -> None:
    for scope, role in tokens.SCOPE_ROLE.items():
        actions = [a for a, (_, s) in auth.ACTIONS.items() if s == scope and a != "tokens"]
        assert actions and all(auth.ROLE_RANK[auth.ACTIONS[a][0]] <= auth.ROLE_RANK[role] for a in actions), scope
    assert tokens.SCOPE_ROLE["admin"] == "admin"
