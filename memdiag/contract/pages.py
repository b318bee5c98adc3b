"""The stable pages of ``memdiag serve`` (contract section 10), as URLs anything may print:
an alert, ``status``, ``explain``, a chat message. One place builds them, so a link printed
today still opens the page it names."""

from __future__ import annotations

from urllib.parse import quote, urlencode


def _path(*parts: str) -> str:
    return "/" + "/".join(quote(p, safe="") for p in parts)


def session_path(session_id: str) -> str:
    return _path("sessions", session_id)


def memory_path(observation_id: str, agent: str | None = None) -> str:
    """A memory's page; ``agent`` for a memory of an agent's recall pipeline."""
    return _path("memories", observation_id) + (f"?{urlencode({'agent': agent})}" if agent else "")


def agent_path(agent_id: str) -> str:
    return _path("agents", agent_id)


def runs_path(baseline: str | None = None, candidate: str | None = None) -> str:
    query = {k: v for k, v in (("baseline", baseline), ("candidate", candidate)) if v}
    return "/runs" + (f"?{urlencode(query)}" if query else "")


def url(base: str, path: str) -> str:
    """``path`` under ``MEMDIAG_SERVE_URL`` (``base``); empty when it is not set."""
    return base.rstrip("/") + path if base else ""
