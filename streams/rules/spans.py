"""What a span says, by the OpenTelemetry GenAI conventions and OpenInference (docs/spans.md):
pure code, no Faust, no Kafka, no protobuf.

:func:`read_span` turns one span (its attributes as plain values, from
``memdiag.schemas.otlp``) into a compact *span record*, the form the trace stage keeps and
routes; or into the reason it cannot be read. A span record says where the span sits (trace,
span, parent), its times, the session and agent it names itself and those its resource
names, and its *role* with what the role needs:

- ``search``: a ``search_memory`` or ``retrieval`` operation, or an OpenInference
  ``RETRIEVER``: the query, the result ids, and the results that carry content (what an
  injection is made of), each with its keywords (what the used/ignored rule reads), never
  its text; ``memdiag.source`` = ``viewer`` (on the span or its resource) marks a human's
  search;
- ``turn``: a ``chat`` (``generate_content``, ``text_completion``) operation, or an
  OpenInference ``LLM``: the words of its output messages' text (as the rule reads a
  response), or why there is none;
- ``agent``: ``invoke_agent`` (OpenInference ``AGENT``), with ``memdiag.outcome`` if set;
- ``tool``: ``execute_tool`` (OpenInference ``TOOL``): the tool's name, ``memdiag.file``,
  success from the span status, and its errors: its exceptions' messages, else (a span in
  ``ERROR`` without one, as ``opentelemetry-util-genai`` records a failed tool call) its
  status description, else its ``error.type``;
- ``write``: ``create_memory`` or ``upsert_memory``: the memories written.

Every other span is a link in its trace (``role`` None): a span between a tool and its agent,
or between a search and the span that names its conversation.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from memdiag.contract import ACCEPTED, BAD_VALUE, MISSING_FIELD
from memdiag.streams.rules.feedback import MIN_KEYWORD_LEN, keywords, normalise_words

SEARCH, TURN, AGENT, TOOL, WRITE = "search", "turn", "agent", "tool", "write"

#: why a turn cannot be judged (memdiag.unjudged_turn_total{reason})
NO_OUTPUT_MESSAGES = "no_output_messages"  # content capture is opt-in: off
NO_TEXT = "no_text"  # the model answered with tool calls only

OUTCOMES = (ACCEPTED, "rejected", "rework")

# -- attribute names ------------------------------------------------------------------------

OPERATION = "gen_ai.operation.name"
CONVERSATION = "gen_ai.conversation.id"
SESSION = "session.id"
AGENT_ID = "gen_ai.agent.id"
AGENT_NAME = "gen_ai.agent.name"
ORG = "memdiag.org_id"
PROJECT = "memdiag.project_id"
OUTCOME = "memdiag.outcome"
FILE = "memdiag.file"
RECOVERABLE = "memdiag.recoverable"
SOURCE = "memdiag.source"
ERROR_TYPE = "error.type"
TOOL_NAME = "gen_ai.tool.name"
MEMORY_QUERY = "gen_ai.memory.query.text"
MEMORY_RECORDS = "gen_ai.memory.records"
MEMORY_RECORD_ID = "gen_ai.memory.record.id"
MEMORY_STORE = "gen_ai.memory.store.id"
RETRIEVAL_QUERY = "gen_ai.retrieval.query.text"
RETRIEVAL_DOCUMENTS = "gen_ai.retrieval.documents"
OUTPUT_MESSAGES = "gen_ai.output.messages"
OI_KIND = "openinference.span.kind"
OI_INPUT = "input.value"
OI_TOOL_NAME = "tool.name"
OI_DOCUMENT_METADATA = "metadata"  # retrieval.documents.N.document.metadata

SEARCH_OPERATIONS = {"search_memory", "retrieval"}
TURN_OPERATIONS = {"chat", "generate_content", "text_completion"}
WRITE_OPERATIONS = {"create_memory", "upsert_memory"}
OI_ROLES = {"RETRIEVER": SEARCH, "LLM": TURN, "AGENT": AGENT, "TOOL": TOOL}

_OI_DOCUMENT = re.compile(r"^retrieval\.documents\.(\d+)\.document\.(id|content|metadata)$")
#: the values of ``memdiag.source`` (a search's ``source`` in the events)
SOURCES = ("agent", "viewer")
_OI_MESSAGE = re.compile(
    r"^llm\.output_messages\.(\d+)\.message\."
    r"(?:content|contents\.(\d+)\.message_content\.(text|type))$"
)


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A span that cannot be mapped: a dead-letter reason and a detail a person can act on."""

    reason: str
    detail: str


def _text(attrs: Mapping[str, Any], *names: str) -> str | None:
    """The first of ``names`` that holds a non-empty string."""
    for name in names:
        v = attrs.get(name)
        if isinstance(v, str) and v:
            return v
    return None


def _ident(v: Any) -> str | None:
    """An id as the conventions allow it (string, or integer in OpenInference)."""
    if isinstance(v, str) and v:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return None


def _json_array(attrs: Mapping[str, Any], name: str) -> list[Any] | Unreadable | None:
    """A JSON attribute (a JSON string, or structured: SDKs do either), as a list."""
    v = attrs.get(name)
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError as exc:
            return Unreadable(BAD_VALUE, f"attribute {name} is not valid JSON ({exc})")
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        return Unreadable(BAD_VALUE, f"attribute {name} must be a JSON array of objects")
    return v


def content_text(content: Any) -> str | None:
    """A memory record's content as text: a string as it is, other JSON as JSON text."""
    if content is None:
        return None
    if isinstance(content, str):
        return content
    return orjson.dumps(content).decode()


def content_id(text: str) -> str:
    """An id for a record that has none, from its content: the same content, the same id."""
    return "content:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _results(
    items: list[dict[str, Any]], id_key: str, content_key: str | None
) -> tuple[list[str], list[list[str]]]:
    """(result ids, [[id, content]] of those with content) of records or documents."""
    ids: list[str] = []
    docs: list[list[str]] = []
    for item in items:
        text = content_text(item.get(content_key)) if content_key else None
        rid = _ident(item.get(id_key))
        if rid is None:
            if text is None:
                continue  # neither id nor content: nothing to know it by
            rid = content_id(text)
        ids.append(rid)
        if text is not None:
            docs.append([rid, text])
    return ids, docs


def _openinference_documents(attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The documents of an OpenInference retriever span, in their index order. A document
    without ``document.id`` takes the ``id`` of its ``document.metadata`` (a JSON object,
    as OpenInference's LangChain instrumentation writes a LangChain ``Document``'s metadata);
    metadata that is no JSON object, or has no usable ``id``, gives none."""
    docs: dict[int, dict[str, Any]] = {}
    for key, v in attrs.items():
        m = _OI_DOCUMENT.match(key)
        if m:
            docs.setdefault(int(m.group(1)), {})[m.group(2)] = v
    out = []
    for i in sorted(docs):
        doc = docs[i]
        metadata = doc.pop(OI_DOCUMENT_METADATA, None)
        if _ident(doc.get("id")) is None and metadata is not None:
            found = _metadata_id(metadata)
            if found is not None:
                doc["id"] = found
        out.append(doc)
    return out


def _metadata_id(metadata: Any) -> str | None:
    """The ``id`` of a document's metadata (a JSON string, or structured), if any."""
    if isinstance(metadata, str):
        try:
            metadata = orjson.loads(metadata)
        except orjson.JSONDecodeError:
            return None  # metadata is the application's own: not memdiag's to refuse
    if not isinstance(metadata, dict):
        return None
    return _ident(metadata.get("id"))


def output_text(messages: list[dict[str, Any]]) -> str | None:
    """The text parts of GenAI output messages (parts-based), joined; None without any."""
    texts = []
    for message in messages:
        parts = message.get("parts")
        if not isinstance(parts, list):
            continue
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "text":
                content = part.get("content")
                if isinstance(content, str):
                    texts.append(content)
    return "\n".join(texts) if texts else None


def _openinference_text(attrs: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(any output message at all, their text) of an OpenInference LLM span."""
    found = False
    texts: dict[tuple[int, int], str] = {}
    kinds: dict[tuple[int, int], str] = {}
    for key, v in attrs.items():
        m = _OI_MESSAGE.match(key)
        if not m:
            continue
        found = True
        i, j, field = int(m.group(1)), m.group(2), m.group(3)
        if j is None:
            if isinstance(v, str):
                texts[(i, -1)] = v
        elif field == "text" and isinstance(v, str):
            texts[(i, int(j))] = v
        elif field == "type" and isinstance(v, str):
            kinds[(i, int(j))] = v
    chosen = [texts[k] for k in sorted(texts) if kinds.get(k, "text") == "text"]
    return found, "\n".join(chosen) if chosen else None


def role_of(attrs: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(role, the operation or kind that gave it)."""
    op = attrs.get(OPERATION)
    if isinstance(op, str) and op:
        if op in SEARCH_OPERATIONS:
            return SEARCH, op
        if op in TURN_OPERATIONS:
            return TURN, op
        if op == "invoke_agent":
            return AGENT, op
        if op == "execute_tool":
            return TOOL, op
        if op in WRITE_OPERATIONS:
            return WRITE, op
        return None, op
    kind = attrs.get(OI_KIND)
    if isinstance(kind, str) and kind.upper() in OI_ROLES:
        return OI_ROLES[kind.upper()], kind.upper()
    return None, None


def read_span(
    trace_id: str,
    span_id: str,
    parent_id: str,
    start_us: int,
    end_us: int,
    attrs: Mapping[str, Any],
    resource: Mapping[str, Any],
    error: bool,
    exceptions: Sequence[Mapping[str, Any]],
    status_message: str = "",
    embed: Callable[[str, bool], bytes] | None = None,
) -> tuple[dict[str, Any], Unreadable | None]:
    """The span record of one span, and what makes its role unreadable (the record is then
    a plain link: it still joins its trace). ``error``: the span's status is ``ERROR``, with
    ``status_message`` its description. ``embed`` (MEMDIAG_DETECTOR=semantic): a search's
    documents and a turn's output text also get their vectors (``dv``, ``wv``: base64), as
    an injection's memories and a response do."""
    rec: dict[str, Any] = {"t": trace_id, "s": span_id, "b": start_us, "e": end_us}
    if parent_id:  # in this service or another (a remote parent): its trace has it, or will
        rec["p"] = parent_id
    for key, value in (
        ("sid", _text(attrs, CONVERSATION, SESSION)),
        ("ag", _text(attrs, AGENT_ID, AGENT_NAME)),
        ("rsid", _text(resource, CONVERSATION, SESSION)),
        ("rag", _text(resource, AGENT_ID, AGENT_NAME)),
        ("org", _text(resource, ORG)),
        ("proj", _text(resource, PROJECT)),
    ):
        if value is not None:
            rec[key] = value
    role, op = role_of(attrs)
    if role is None:
        return rec, None
    problem = _role(rec, role, op, attrs, error, exceptions, status_message, embed)
    if problem is None and role == SEARCH:
        problem = _source(rec, attrs, resource)
    texts = rec.pop("_texts", None)
    if problem is None and texts is not None and embed is not None and "docs" in rec:
        # an agent's search (a viewer's injects nothing): its documents' vectors, unless they
        # would make the record too long to travel (its turn is then judged by the words)
        vectors = [_b64(embed(text, True)) for text in texts]
        if sum(map(len, vectors)) <= MAX_VECTOR_CHARS:
            rec["dv"] = vectors
    if problem is not None:
        for key in [k for k in rec if k not in _LINK_KEYS]:
            del rec[key]
    return rec, problem


#: The base64 characters of a search span's documents' vectors a span record carries at
#: most (about 48 one-sentence documents, or 12 of 16 sentences): past it the record would
#: grow far beyond its span (a document of one-word sentences embeds to 70 times its size),
#: and its turn is judged by the keyword rule.
MAX_VECTOR_CHARS = 64 * 1024


def _b64(rows: bytes) -> str:
    """Vectors as the span record carries them (it travels as JSON)."""
    return base64.b64encode(rows).decode("ascii")


_LINK_KEYS = frozenset({"t", "s", "p", "b", "e", "sid", "ag", "rsid", "rag", "org", "proj"})


def _role(
    rec: dict[str, Any],
    role: str,
    op: str | None,
    attrs: Mapping[str, Any],
    error: bool,
    exceptions: Sequence[Mapping[str, Any]],
    status_message: str,
    embed: Callable[[str, bool], bytes] | None = None,
) -> Unreadable | None:
    if role == SEARCH:
        if op == "search_memory":
            items = _json_array(attrs, MEMORY_RECORDS)
            query, id_key, content_key = _text(attrs, MEMORY_QUERY), "id", "content"
        elif op == "retrieval":
            items = _json_array(attrs, RETRIEVAL_DOCUMENTS)
            query, id_key, content_key = _text(attrs, RETRIEVAL_QUERY), "id", "content"
        else:
            items = _openinference_documents(attrs)
            query, id_key, content_key = _text(attrs, OI_INPUT), "id", "content"
        if isinstance(items, Unreadable):
            return items
        ids, docs = _results(items or [], id_key, content_key)
        rec.update(role=SEARCH, q=query or "", ids=ids)
        if docs:
            rec["docs"] = [[rid, sorted(keywords(text))] for rid, text in docs]
            if embed is not None:  # embedded by read_span once the source is known
                rec["_texts"] = [text for _, text in docs]
        return None
    if role == TURN:
        rec["role"] = TURN
        if op in TURN_OPERATIONS:
            messages = _json_array(attrs, OUTPUT_MESSAGES)
            if isinstance(messages, Unreadable):
                return messages
            found, text = messages is not None, output_text(messages or [])
        else:
            found, text = _openinference_text(attrs)
        if text is not None and text.strip():
            rec["words"] = sorted({w for w in normalise_words(text) if len(w) >= MIN_KEYWORD_LEN})
            if embed is not None:
                rec["wv"] = _b64(embed(text, False))
        else:
            rec["why"] = NO_TEXT if found else NO_OUTPUT_MESSAGES
        return None
    if role == AGENT:
        rec["role"] = AGENT
        outcome = attrs.get(OUTCOME)
        if outcome is not None:
            if outcome not in OUTCOMES:
                return Unreadable(
                    BAD_VALUE,
                    f"{OUTCOME} is {str(outcome)[:40]!r}; expected one of {list(OUTCOMES)}",
                )
            rec["outcome"] = outcome
        return None
    if role == TOOL:
        name = _text(attrs, TOOL_NAME, OI_TOOL_NAME)
        if name is None:
            return Unreadable(MISSING_FIELD, f"a tool span without {TOOL_NAME}: which tool ran?")
        rec.update(role=TOOL, tool=name, ok=not error)
        file = _text(attrs, FILE)
        if file is not None:
            rec["file"] = file
        # its errors are its exceptions (contract section 8); a failed tool span without one
        # has one error, its status description, else its error.type (as
        # opentelemetry-util-genai records a failed tool call); a failed span with neither
        # is a failed call with no error, as a published tool call with success false is
        errors = [m for e in exceptions if (m := _exception_message(e)) is not None]
        if not errors and error:
            message = status_message or _text(attrs, ERROR_TYPE)
            if message:
                errors = [message]
        if errors:
            rec["err"] = errors
        if attrs.get(RECOVERABLE) is True:
            rec["rec"] = True
        return None
    # WRITE
    ids = []
    single = _ident(attrs.get(MEMORY_RECORD_ID))
    if single is not None:
        ids.append(single)
    else:
        items = _json_array(attrs, MEMORY_RECORDS)
        if isinstance(items, Unreadable):
            return items
        ids = [rid for item in items or [] if (rid := _ident(item.get("id"))) is not None]
    if not ids:
        return Unreadable(
            MISSING_FIELD,
            f"a {op} span without {MEMORY_RECORD_ID} (or ids in {MEMORY_RECORDS}): which "
            "memory was written?",
        )
    if error:
        return None  # the write failed: nothing was written (a plain link)
    rec.update(role=WRITE, mids=list(dict.fromkeys(ids)))
    store = _text(attrs, MEMORY_STORE)
    if store is not None:
        rec["store"] = store
    return None


def _source(
    rec: dict[str, Any], attrs: Mapping[str, Any], resource: Mapping[str, Any]
) -> Unreadable | None:
    """``memdiag.source`` of a search span (else of its resource): ``viewer`` marks a human's
    search, which is counted and never judged, as a published one (and injects nothing: its
    results' keywords are not kept). Another value on the span is a ``bad_value``; on the
    resource, which says it of every span of a service, it is not memdiag's and ignored."""
    source = attrs.get(SOURCE)
    if source is None:
        source = resource.get(SOURCE)
        if source not in SOURCES:
            source = None
    if source is None or source == "agent":
        return None
    if source == "viewer":
        rec["src"] = "viewer"
        rec.pop("docs", None)
        return None
    return Unreadable(
        BAD_VALUE, f"{SOURCE} is {str(source)[:40]!r}; expected one of {list(SOURCES)}"
    )


def _exception_message(event: Mapping[str, Any]) -> str | None:
    return _text(event, "exception.message", "exception.type")
