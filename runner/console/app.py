"""The console's routes (Starlette): pages for people, JSON for API clients, actions as POST.

Every request names one of the console's host names (guard.py); every POST proves its origin,
and unless a bearer token authenticates it, carries the CSRF token of its session: a form field
`csrf`, or the header `X-CSRF-Token` for an API client signed in with a cookie. A console
without a token file gives each browser an operator session for its forms' CSRF tokens.

Every run a principal may not see answers 404, exactly like a missing one. Author content
(names, values, logs, errors, sources) only ever reaches a page through Jinja2's escaping;
pages load one script and one stylesheet from this package, and the Content-Security-Policy
allows nothing else.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from qjsflow.bridge import InvalidInput, QjsflowError
from qjsflow.runner.console import views
from qjsflow.runner.console.auth import OPERATOR, SESSION_COOKIE, Principal, Sessions, Tokens
from qjsflow.runner.console.guard import LOOPBACK_NAMES, prove_same_origin, served_host
from qjsflow.runner.runner import Runner
from qjsflow.runner.tenancy.scopes import ALL_SCOPES, AllScopes, validate_scope
from qjsflow.runner.views import RUN_STATUSES

__all__ = ["create_app"]

# Resolved: the static files are served from their real folder (Starlette refuses a file that
# is a link out of the folder it serves, as an editable install's files are).
_HERE = Path(__file__).resolve().parent
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; connect-src 'self'"
)
_MAX_FORM_BYTES = 64 * 1024
_VERBS = ("signal", "cancel", "terminate", "pause", "resume", "restart", "fork")
_CONFIRMED = ("cancel", "terminate", "restart", "fork")
_DONE = {
    "signal": "Event sent: the run takes it when a wait asks for it.",
    "cancel": "Cancel asked: the run stops at its next suspension.",
    "terminate": "Terminated.", "pause": "Pause asked: the run parks after the steps under way.",
    "resume": "Resumed: a worker drives the run.", "restart": "Restarted: a worker drives the run.",
    "fork": "Forked: this is the new run.",
}  # fmt: skip


class _KnownHosts:
    """Answers only requests whose `Host` is one of the console's names (DNS rebinding)."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and served_host(Request(scope), self.hosts) is None:
            refused = Response("this console does not answer that host name",
                               status_code=421, media_type="text/plain")  # fmt: skip
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _Headers(BaseHTTPMiddleware):
    async def dispatch(
        self, request: Request, call_next: Callable[..., Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = _CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        # "same-origin", not "no-referrer": with no referrer policy a browser sends `Origin: null`
        # on its own forms, and the origin check needs their true origin.
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Cache-Control"] = "no-store"
        return response


class _Console:
    """The handlers, over one Runner (opened by the app's lifespan)."""

    def __init__(self, runner_factory: Callable[[], Awaitable[Runner]], tokens: Tokens | None):
        self.templates = Environment(
            loader=FileSystemLoader(_HERE / "templates"), autoescape=select_autoescape(["html"])
        )
        self.templates.filters.update(views.FILTERS)
        self.sessions = Sessions()
        self.tokens = tokens
        self.runner_factory = runner_factory
        self._runner: Runner | None = None

    @property
    def runner(self) -> Runner:
        assert self._runner is not None, "the console's runner opens with the app"
        return self._runner

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._runner = await self.runner_factory()
        try:
            yield
        finally:
            await self._runner.aclose()

    def who(self, request: Request) -> Principal:
        return self.caller(request)[0]

    def caller(self, request: Request) -> tuple[Principal, bool]:
        """Who is asking, and whether a bearer token says so (a request no other site's page
        can make, so it needs no CSRF token)."""
        if self.tokens is not None:
            header = request.headers.get("authorization", "")
            if header.startswith("Bearer "):
                principal = self.tokens.principal(header.removeprefix("Bearer ").strip())
                if principal is not None:
                    return principal, True
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        if session is not None:
            return session.principal, False
        if self.tokens is None:
            return OPERATOR, False
        raise HTTPException(401)

    def prove_intent(self, request: Request, form: dict[str, str], by_bearer: bool) -> None:
        """A state-changing request came from this console's own pages or from a client that
        is no browser: its origin, and its session's CSRF token unless a bearer token or (a
        console without tokens, no browser's marks) nothing could have been forged."""
        prove_same_origin(request)
        if by_bearer:
            return
        csrf = self.csrf_of(request)
        given = form.get("csrf") or request.headers.get("x-csrf-token")
        forgeable = csrf or not _no_browser(request) or self.tokens is not None
        if forgeable and not _same(given, csrf):
            raise HTTPException(403, "the form's CSRF token is missing or wrong")

    def csrf_of(self, request: Request) -> str:
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        return "" if session is None else session.csrf

    def render(self, name: str, csrf: str = "", **context: Any) -> str:
        return self.templates.get_template(name).render(
            csrf=csrf, signed_in=self.tokens is not None, statuses=RUN_STATUSES, **context
        )

    def page(self, request: Request, name: str, **context: Any) -> HTMLResponse:
        csrf = self.csrf_of(request)
        if csrf or self.tokens is not None:
            return HTMLResponse(self.render(name, csrf, **context))
        # No sign-in on this console: the browser's forms still need a session's CSRF token.
        session_id, session = self.sessions.open(OPERATOR)
        response = HTMLResponse(self.render(name, session.csrf, **context))
        _set_session(response, request, session_id)
        return response

    async def runs(self, request: Request) -> Response:
        query = views.RunQuery.parse(request.query_params, self.who(request))
        listed = await views.list_runs(self.runner, query)
        counts = await self.runner.store.count_runs_by_status(query.scope)
        if _api(request):
            return JSONResponse(views.plain({**listed, "counts": counts}))
        return self.page(request, "runs.html", query=query, counts=counts, **listed)

    async def run(self, request: Request) -> Response:
        scope, run_id = _visible(request, self.who(request))
        detail = await views.run_detail(self.runner, scope, run_id)
        if _api(request):
            return JSONResponse(views.plain(detail))
        notice = _DONE.get(request.query_params.get("done", ""))
        return self.page(request, "run.html", notice=notice, **detail)

    async def run_state(self, request: Request) -> Response:
        """What a run's page polls: it reloads when this changes."""
        scope, run_id = _visible(request, self.who(request))
        try:
            found = await self.runner.get(run_id, scope=scope)
        except InvalidInput:
            raise HTTPException(404) from None
        return JSONResponse({"status": found.status, "updated": found.updated_at})

    async def act(self, request: Request) -> Response:
        principal, by_bearer = self.caller(request)
        scope, run_id = _visible(request, principal)
        verb = request.path_params["verb"]
        if verb not in _VERBS:
            raise HTTPException(404)
        form = await _form(request)
        api = _api(request)
        self.prove_intent(request, form, by_bearer)
        if not api and verb in _CONFIRMED and form.get("confirm") != "yes":
            raise HTTPException(400, f"confirm the {verb} first")
        try:
            done = await views.act(self.runner, verb, scope, run_id, form)
        except (InvalidInput, QjsflowError) as error:
            if api:
                return JSONResponse({"error": str(error)[:500]}, status_code=400)
            return self.page(request, "error.html", message=str(error)[:500],
                             back=f"/runs/{scope}/{run_id}")  # fmt: skip
        if api:
            return JSONResponse(views.plain(done))
        # The page says what was done (the verb only: nothing the form carried is echoed).
        return RedirectResponse(f"/runs/{done.scope}/{done.run_id}?done={verb}", status_code=303)

    async def snapshots(self, request: Request) -> Response:
        return await self._per_scope(
            request, "snapshots", lambda scope: self.runner.snapshots(scope=scope, limit=200)
        )

    async def usage(self, request: Request) -> Response:
        """Each scope's runs and what it used of its budgets."""
        return await self._per_scope(request, "usage", lambda scope: self.runner.usage(scope=scope))

    async def _per_scope(
        self, request: Request, name: str, read: Callable[[str | AllScopes], Awaitable[Any]]
    ) -> Response:
        """A page of what `read` finds for the scope a token is bound to, or (an operator)
        for `?scope=` or every scope; `name` is the page's template and the value's name."""
        scope = self.who(request).scope or request.query_params.get("scope") or None
        try:
            found = await read(scope or ALL_SCOPES)
        except InvalidInput:  # an invalid scope: as a missing one
            raise HTTPException(404) from None
        if _api(request):
            return JSONResponse(views.plain(found))
        return self.page(request, f"{name}.html", scope=scope, **{name: found})

    async def scope_config(self, request: Request) -> Response:
        """A scope's configuration in the journal (`?version=N`, the latest without it) and its
        versions: for its own token and operators (secret names only: the journal holds no
        value). An operator's POST applies a new version (JSON), or `rollback` to one."""
        principal, by_bearer = self.caller(request)
        scope = request.path_params["scope"]
        try:
            scope = validate_scope(scope)
        except InvalidInput:  # as a scope that does not exist
            raise HTTPException(404) from None
        if not principal.may_see(scope):
            raise HTTPException(404)
        api, problem = _api(request), None
        if request.method == "POST":
            if principal.scope is not None:  # a tenant reads its settings; operators set them
                raise HTTPException(404)
            form = await _form(request)
            self.prove_intent(request, form, by_bearer)
            try:
                rollback = form.get("rollback", "")
                if rollback and not (rollback.isdigit() and 1 <= int(rollback) <= 2**62):
                    raise InvalidInput(f"no version {rollback[:40]!r} to roll back to")
                applied = await (
                    self.runner.rollback_scope_config(scope, int(rollback)) if rollback
                    else self.runner.apply_scope_config(scope, form.get("config", ""))
                )  # fmt: skip
            except InvalidInput as error:
                if api:
                    return JSONResponse({"error": str(error)[:2000]}, status_code=400)
                problem = str(error)[:2000]
            else:
                if api:
                    return JSONResponse(views.plain(applied))
                return RedirectResponse(f"/scopes/{scope}/config?done=applied", status_code=303)
        versions = await self.runner.scope_config_history(scope)
        wanted = request.query_params.get("version", "")
        shown = next((v for v in versions if str(v.version) == wanted), None) if wanted else None
        shown = shown or (versions[0] if versions else None)
        if wanted and (shown is None or str(shown.version) != wanted):
            raise HTTPException(404)
        if api:
            return JSONResponse(views.plain({"shown": shown, "versions": versions}))
        return self.page(request, "scope_config.html", scope=scope, shown=shown,
                         versions=versions, problem=problem,
                         operator=principal.scope is None)  # fmt: skip

    async def workers(self, request: Request) -> Response:
        """The workers serving the journal, live, gone or stopped (operators only: a worker
        serves every scope, and a tenant sees only its own)."""
        if self.who(request).scope is not None:
            raise HTTPException(404)
        found = await self.runner.workers()
        if _api(request):
            return JSONResponse(views.plain(found))
        return self.page(request, "workers.html", workers=found,
                         scope_databases=self.runner.scopes.mode)  # fmt: skip

    async def schedules(self, request: Request) -> Response:
        """Schedules: when each fires next, what it fired and skipped, the run it started
        last (a scope's token sees its own scope's; operators every scope's)."""
        scope = self.who(request).scope
        found = await self.runner.schedules(scope=ALL_SCOPES if scope is None else scope)
        if _api(request):
            return JSONResponse(views.plain(found))
        return self.page(request, "schedules.html", schedules=found)

    async def snapshot(self, request: Request) -> Response:
        scope = request.path_params["scope"]
        if not self.who(request).may_see(scope):
            raise HTTPException(404)
        snapshot_id = request.path_params["snapshot_id"]
        detail = await views.snapshot_detail(self.runner, scope, snapshot_id)
        return self.page(request, "snapshot.html", **detail)

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.page(request, "login.html", failed=False)
        prove_same_origin(request)
        form = await _form(request)
        token = str(form.get("token") or "")
        principal = None if self.tokens is None else self.tokens.principal(token)
        if principal is None:
            return HTMLResponse(self.render("login.html", failed=True), status_code=401)
        session_id, _ = self.sessions.open(principal)
        response = RedirectResponse("/runs", status_code=303)
        _set_session(response, request, session_id)
        return response

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/runs", status_code=303)

    async def refused(self, request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if _api(request):
            return JSONResponse({"error": error.detail}, status_code=error.status_code)
        if error.status_code == 401:
            return RedirectResponse("/login", status_code=303)
        body = self.render("error.html", message=f"{error.status_code}: {error.detail}",
                           back="/runs")  # fmt: skip
        return HTMLResponse(body, status_code=error.status_code)


def create_app(
    runner_factory: Callable[[], Awaitable[Runner]],
    tokens: Tokens | None,
    hosts: tuple[str, ...] = LOOPBACK_NAMES,
) -> Starlette:
    """The app; `tokens` None means no sign-in (only for a console bound to loopback);
    `hosts` are the names it answers (guard.host_names)."""
    console = _Console(runner_factory, tokens)
    routes = [
        Route("/", console.home),
        Route("/login", console.login, methods=["GET", "POST"]),
        Route("/runs", console.runs),
        Route("/api/runs", console.runs),
        Route("/runs/{scope}/{run_id}", console.run),
        Route("/api/runs/{scope}/{run_id}", console.run),
        Route("/runs/{scope}/{run_id}/state", console.run_state),
        Route("/runs/{scope}/{run_id}/{verb}", console.act, methods=["POST"]),
        Route("/api/runs/{scope}/{run_id}/{verb}", console.act, methods=["POST"]),
        Route("/snapshots", console.snapshots),
        Route("/api/snapshots", console.snapshots),
        Route("/snapshots/{scope}/{snapshot_id}", console.snapshot),
        Route("/scopes/{scope}/config", console.scope_config, methods=["GET", "POST"]),
        Route("/api/scopes/{scope}/config", console.scope_config, methods=["GET", "POST"]),
        Route("/schedules", console.schedules),
        Route("/api/schedules", console.schedules),
        Route("/workers", console.workers),
        Route("/api/workers", console.workers),
        Route("/usage", console.usage),
        Route("/api/usage", console.usage),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes, lifespan=console.lifespan,
        middleware=[Middleware(_KnownHosts, hosts=hosts), Middleware(_Headers)],
        exception_handlers={HTTPException: console.refused},
    )  # fmt: skip


async def _form(request: Request) -> dict[str, str]:
    """A posted form (`application/x-www-form-urlencoded`), at most 64 KiB: the first value
    of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM_BYTES:
            raise HTTPException(413, "the form is too large")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=50)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, "the form cannot be read") from None
    return {name: values[0] for name, values in fields.items()}


def _set_session(response: Response, request: Request, session_id: str) -> None:
    response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")  # fmt: skip


def _no_browser(request: Request) -> bool:
    """No cookie and none of the marks a browser puts on what a page sends."""
    headers = request.headers
    return not request.cookies and not any(
        name in headers for name in ("origin", "referer", "sec-fetch-site", "sec-fetch-mode")
    )


def _api(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _visible(request: Request, principal: Principal) -> tuple[str, str]:
    scope, run_id = request.path_params["scope"], request.path_params["run_id"]
    if not principal.may_see(scope):
        raise HTTPException(404)  # as a missing run: another scope's runs do not exist here
    return scope, run_id


async def _found(lookup: Awaitable[Any]) -> Any:
    try:
        return await lookup
    except InvalidInput:
        raise HTTPException(404) from None


def _same(given: object, expected: str) -> bool:
    return bool(expected) and isinstance(given, str) and hmac.compare_digest(given, expected)
