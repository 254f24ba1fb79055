"""The HTML pages: one router per page group, rendered from frontend/templates.

Routes stay thin: parse, call one service, render. Figures are built by backend.figures (pure)
and drawn by the plotly.js that the installed plotly package ships (`assets`).

- `runs`         the index, the job form, a run's page, its live status, cancel
- `compare`      runs side by side, and the comparison's exports
- `leaderboard`  the lab-wide leaderboard, and its exports
- `scaling`      throughput against world size
- `planning`     the ranking form, sweeps, and a run's "vary one thing" (issue 14)
- `assets`       plotly.js and the static files
- `rendering`    the template environment and the helpers the pages share
"""

from __future__ import annotations

from fastapi import APIRouter

from backend.api.pages import assets, compare, leaderboard, planning, runs, scaling

ROUTERS: tuple[APIRouter, ...] = (assets.router, runs.router, compare.router, leaderboard.router, scaling.router, planning.router)
"""Every page router, for the app to include."""
