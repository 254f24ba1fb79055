"""/glossary: every metric in plain words (backend.services.glossary), the target of the help icons."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import SettingsDep
from backend.api.pages.rendering import render
from backend.services.glossary import TERMS

router = APIRouter(include_in_schema=False)


@router.get("/glossary", response_class=HTMLResponse)
def glossary_page(request: Request, settings: SettingsDep) -> HTMLResponse:
    return render(request, "glossary.html", {"terms": TERMS}, settings=settings)
