"""CI metadata from the CI's own environment (GitHub Actions, GitLab CI), for `parallab upload`'s defaults.

Pure: the caller passes the environment, so tests give it one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

FIELDS = ("repository", "branch", "commit", "pr", "ci_url")


def _github(env: Mapping[str, str]) -> dict[str, str | int | None]:
    pr = re.fullmatch(r"refs/pull/(\d+)/(?:merge|head)", env.get("GITHUB_REF", ""))
    branch = env.get("GITHUB_HEAD_REF") or (env.get("GITHUB_REF_NAME") if env.get("GITHUB_REF_TYPE", "branch") == "branch" else None)
    run_url = None
    if env.get("GITHUB_SERVER_URL") and env.get("GITHUB_REPOSITORY") and env.get("GITHUB_RUN_ID"):
        run_url = f"{env['GITHUB_SERVER_URL'].rstrip('/')}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
        if env.get("GITHUB_RUN_ATTEMPT"):
            run_url += f"/attempts/{env['GITHUB_RUN_ATTEMPT']}"
    return {
        "repository": env.get("GITHUB_REPOSITORY"),
        "branch": branch or None,
        "commit": env.get("GITHUB_SHA"),
        "pr": int(pr.group(1)) if pr else None,
        "ci_url": run_url,
    }


def _gitlab(env: Mapping[str, str]) -> dict[str, str | int | None]:
    iid = env.get("CI_MERGE_REQUEST_IID", "")
    return {
        "repository": env.get("CI_PROJECT_PATH"),
        "branch": env.get("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME") or env.get("CI_COMMIT_BRANCH") or env.get("CI_COMMIT_REF_NAME"),
        "commit": env.get("CI_COMMIT_SHA"),
        "pr": int(iid) if iid.isdigit() else None,
        "ci_url": env.get("CI_JOB_URL"),
    }


def ci_metadata(env: Mapping[str, str]) -> dict[str, str | int | None]:
    """repository, branch, commit, pr and ci_url as the running CI tells them (None where it does not)."""
    if env.get("GITHUB_ACTIONS") == "true":
        return _github(env)
    if env.get("GITLAB_CI") == "true":
        return _gitlab(env)
    return dict.fromkeys(FIELDS)
