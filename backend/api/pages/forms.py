"""The pages' posted forms, read before the (sync) route runs so no database work blocks the event loop.

Two kinds of POST: `FormDep` for the forms that answer a bad CSRF token by re-rendering their own
page with the message (login, the job form, the sweep form), and `CheckedFormDep` for every other
form, which answers it with a bare 403 before the route runs. Put a `CheckedFormDep` parameter
after the route's role dependency: FastAPI solves dependencies in signature order, so a caller
without the role hears about the role, not the token.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.datastructures import FormData

from backend.api import csrf
from backend.api.deps import SettingsDep


async def read_form(request: Request) -> FormData:
    """The posted form, unchecked: the route verifies its CSRF token itself."""
    return await request.form()


async def checked_form(request: Request, settings: SettingsDep) -> FormData:
    """The posted form, its CSRF token verified (403 naming what is wrong otherwise)."""
    form = await request.form()
    csrf.require_form_token(request, form, settings.security.secret_key)
    return form


FormDep = Annotated[FormData, Depends(read_form)]
CheckedFormDep = Annotated[FormData, Depends(checked_form)]
