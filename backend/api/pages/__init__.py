"""The HTML pages: one router per page group, rendered from frontend/templates.

Routes stay thin: parse, call one service, render. Figures are built by backend.figures (pure)
and drawn by the plotly.js that the installed plotly package ships (`assets`).

- `runs`         the index, the job form, a run's page, its live status, cancel
- `compare`      runs side by side, and the comparison's exports
- `leaderboard`  the lab-wide leaderboard, and its exports
- `scaling`      throughput against world size
- `accounts`     log in and out, one's API tokens, users (admins)
- `series`       CI series and their history with alerts
- `workers`      the fleet: pools, hosts, what each runs, queue lengths
- `planning`     the ranking form, sweeps, and a run's "vary one thing"
- `glossary`     every metric in plain words (the help icons' target)
- `assets`       plotly.js and the static files
- `rendering`    the template environment and the helpers the pages share
"""

from __future__ import annotations

from fastapi import APIRouter

from backend.api.pages import accounts, assets, compare, glossary, leaderboard, planning, runs, scaling, series, workers

ROUTERS: tuple[APIRouter, ...] = (
    assets.router,
    runs.router,
    compare.router,
    leaderboard.router,
    scaling.router,
    accounts.router,
    series.router,
    workers.router,
    planning.router,
    glossary.router,
)
"""Every page router, for the app to include."""
