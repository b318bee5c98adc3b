"""The semantic rule's similarity (memdiag.semantic, issue #39): loaded offline from the
files inside wordllama's wheel, checked by their sha256, exact on every machine, and what
it scores on memdiag's labelled pairs (tests/data/used_pairs.jsonl)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import shutil
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag import semantic as sm

PAIRS = Path(__file__).parents[1] / "data" / "used_pairs.jsonl"
SIGNING = "Rotate the signing key before the token expires."
LONG = (
    "I looked at the failing job first. The cache was stale, so I cleared it. Then I rolled "
    "the auth token's signing secret ahead of its expiry. Finally the deploy went through."
)


@pytest.fixture(scope="module")
def model() -> sm.Model:
    return sm.model()


def pairs() -> list[dict]:
    return [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]


def _files(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*") if p.is_file()}


def test_it_loads_with_the_network_off_and_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    """No socket can connect, HOME and the working directory are empty folders: the model
    loads from the installed package alone, checks both checksums, never imports the
    package (it would configure logging), and leaves every folder as it was."""

    def refuse(*args, **kwargs):
        raise OSError("the network is off in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.chdir(cwd)
    package = sm._locate()
    before = _files(package)
    m = sm.Model()  # a new load, not the process's cached one
    sim = sm.similarity(m.vectors(SIGNING), m.vectors(LONG))
    assert 0.5 < sim < 0.6
    assert not any(home.iterdir()) and not any(cwd.iterdir())
    assert _files(package) == before
    assert "wordllama" not in sys.modules
    data = (package / sm.WEIGHTS).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sm.WEIGHTS_SHA256


def test_files_that_are_not_the_tested_ones_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "wordllama"
    shutil.copytree(sm._locate(), root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    sm.Model(root)  # the copy is good
    weights = root / sm.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(sm.ModelMissing, match=r"not the file memdiag was tested with.*0\.4\.0"):
        sm.Model(root)
    (root / sm.TOKENIZER).unlink()
    with pytest.raises(sm.ModelMissing, match="cannot read the similarity model's file"):
        sm.Model(root)


def test_a_missing_package_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(sm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(sm.ModelMissing, match=r"pip install 'memdiag\[semantic\]'"):
        sm.Model()


def test_the_same_text_gives_the_same_bytes_on_every_machine(model: sm.Model) -> None:
    """Pinned: the rows of two texts, and similarities to 1e-6. Exact sums (float16 weights
    are multiples of 2^-24), one correctly rounded division and rint a row, integer dot
    products: nothing here depends on the CPU, the BLAS or threads."""
    rows = model.vectors(SIGNING) + model.vectors(LONG)
    assert len(rows) == 6 * sm.DIMS  # one row, then the whole and four sentences
    assert hashlib.sha256(rows).hexdigest() == (
        "513907a46122f81c3fa477cd28fe7e76c1bf4eee1c2acabd53393c096c20a83d"
    )
    assert sm.similarity(model.vectors(SIGNING), model.vectors(LONG)) == 0.553392
    assert sm.similarity(model.vectors("Deploys need the canary flag."),
                         model.vectors("The canary flag is needed for deploys!")) == 0.891582  # fmt: skip


def test_words_are_tokenised_as_the_whole_text_is(model: sm.Model) -> None:
    """Token ids are remembered per word; a text's ids are the ones the tokenizer gives the
    whole text (the sum, so the embedding, cannot tell them apart)."""
    for pair in pairs():
        for text in (pair["memory"], pair["response"]):
            whole = model._tokenizer.encode(text, add_special_tokens=False).ids
            assert Counter(i for s in model.tokens(text) for i in s) == Counter(whole)


def test_sentences_and_the_cap_on_rows(model: sm.Model) -> None:
    assert [len(s) > 0 for s in model.tokens("One. Two!\nThree? four")] == [True] * 4
    assert len(model.tokens("no end mark here")) == 1
    assert model.vectors("") == b"" and model.vectors("  \n ") == b""
    many = " ".join(f"Sentence number {i} is here." for i in range(40))
    assert len(model.tokens(many)) == sm.MAX_ROWS - 1
    assert len(model.vectors(many)) == sm.MAX_ROWS * sm.DIMS


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80), st.text(max_size=80))
def test_similarity_is_symmetric_bounded_and_one_on_itself(a: str, b: str) -> None:
    m = sm.model()
    va, vb = m.vectors(a), m.vectors(b)
    s = sm.similarity(va, vb)
    assert s == sm.similarity(vb, va) and 0.0 <= s <= 1.0
    if va:
        assert sm.similarity(va, va) == 1.0
    else:
        assert s == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=6), st.text(max_size=80))
def test_a_turns_similarities_in_one_product_are_each_pairs(memories: list, response: str) -> None:
    """memdiag.semantic.similarities (a turn's memories against its response, one product)
    gives each pair's similarity to the bit, empty texts included."""
    m = sm.model()
    rows = [m.vectors(t) for t in memories]
    r = m.vectors(response)
    assert sm.similarities(rows, r) == [sm.similarity(v, r) for v in rows]


def test_paraphrases_score_above_their_unrelated_partners(model: sm.Model) -> None:
    """Each paraphrase pair against the same memory with the unrelated pair's response of
    the same position: the model ranks 15 of the 16 right. The one it misses, p017, shares
    no word with its memory ("JWT signing key" / "a fresh secret for minting auth tokens")."""
    rows = pairs()
    para = [p for p in rows if p["kind"] == "paraphrase"]
    unrelated = [p for p in rows if p["kind"] == "unrelated"]
    wrong = []
    for p, u in zip(para, unrelated, strict=True):
        memory = model.vectors(p["memory"])
        used = sm.similarity(memory, model.vectors(p["response"]))
        other = sm.similarity(memory, model.vectors(u["response"]))
        if used <= other:
            wrong.append(p["id"])
    assert wrong == ["p017"]


def _reference(a: bytes, b: bytes) -> float:
    """The similarity in Python integers: the largest cosine of two rows, clipped, rounded."""
    rows = lambda v: [list(memoryview(v)[i : i + sm.DIMS].cast("b"))  # noqa: E731
                      for i in range(0, len(v), sm.DIMS)]  # fmt: skip
    best = 0.0
    for x in rows(a):
        for y in rows(b):
            dot = sum(p * q for p, q in zip(x, y, strict=True))
            best = max(best, dot / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y)))
    return round(min(best, 1.0), 6)


def test_the_similarity_equals_one_computed_in_python_integers(model: sm.Model) -> None:
    for pair in pairs()[::4]:
        a, b = model.vectors(pair["memory"]), model.vectors(pair["response"])
        assert sm.similarity(a, b) == _reference(a, b)


def test_a_long_text_costs_what_its_start_costs(model: sm.Model) -> None:
    """Only the first MAX_CHARS characters are embedded, and a word longer than MAX_WORD is
    read in pieces: a megabyte event is bounded work, the same on every machine."""
    start = " ".join(f"word{i}." for i in range(5000))[: sm.MAX_CHARS]
    assert model.vectors(start + " more" * 200_000) == model.vectors(start)
    word = "x" * 1_000_000
    piece = list(model._ids("x" * sm.MAX_WORD))
    assert model.tokens(word) == [piece * (sm.MAX_CHARS // sm.MAX_WORD)]
    assert len(model.vectors(word)) == sm.DIMS


def test_a_tokenizer_that_reads_the_file_otherwise_is_refused(monkeypatch) -> None:
    """The files pass their checksums, but a fixed text's vectors differ (another version of
    the tokenizers library, say): refused at load, with what to install."""
    monkeypatch.setattr(sm, "PROBE_SHA256", "0" * 64)
    with pytest.raises(sm.ModelMissing, match="embeds a fixed text otherwise"):
        sm.Model()


def test_the_embedder_remembers_memories_not_responses(model: sm.Model) -> None:
    embed = sm.embedder(entries=2)
    assert embed(SIGNING) == model.vectors(SIGNING) == embed(SIGNING)
    assert embed(LONG, False) == model.vectors(LONG)


def test_the_workers_memory_rows_are_in_its_one_byte_budget(model: sm.Model) -> None:
    """The session stage keeps a memory's rows in the worker's budget of decoded state
    (MEMDIAG_DECODED_CACHE_MB), weighing their bytes and key; a response's are not kept."""
    import dataclasses

    from memdiag.settings import Settings
    from memdiag.streams.lru import DECODED_PER_ENCODED, shared_budget
    from memdiag.streams.stages.sessions import SessionStage

    settings = dataclasses.replace(Settings(), detector="semantic", decoded_cache_mb=3)
    stage = SessionStage(settings, lambda session_id: 0)
    embed = stage._config.embed
    assert embed is not None
    budget = shared_budget(3 << 20)
    [rows_cache] = [c for c in budget._caches.values() if c.name == "memory rows"]
    before = budget.used
    rows = embed(SIGNING, True)
    assert rows == model.vectors(SIGNING) and embed(SIGNING, True) is rows
    assert embed(LONG, False) == model.vectors(LONG)
    assert len(rows_cache) == 1
    assert budget.used - before == DECODED_PER_ENCODED + len(rows) + 32 + sm.ENTRY_BYTES


def test_the_worker_stops_at_start_when_the_model_is_missing(monkeypatch, capsys) -> None:
    from memdiag.cli import main

    def missing() -> sm.Model:
        raise sm.ModelMissing("MEMDIAG_DETECTOR=semantic needs the similarity model")

    monkeypatch.setattr(sm, "model", missing)
    monkeypatch.setenv("MEMDIAG_DETECTOR", "semantic")
    assert main(["worker"]) == 2
    assert "needs the similarity model" in capsys.readouterr().err


def test_a_log_written_before_the_vectors_decodes() -> None:
    """Session state written by the version before: no trailing vectors field."""
    from memdiag.streams.session.records import InjectionRec, ResponseRec, decode

    old = b'[["i","e1",10,"t1",[["o1",["token"]]],[],[],0],["r","e2",20,"t1",["token"],0]]'
    injection, response = decode(old)
    assert isinstance(injection, InjectionRec) and injection.vectors is None
    assert isinstance(response, ResponseRec) and response.vectors is None


def test_a_sessions_cache_weight_counts_its_vectors_once() -> None:
    """Under the semantic rule a session's log holds its vectors as base64 in the JSON; the
    session counts exactly those stored bytes (``vector_bytes``) as it applies its events
    and as it is loaded again, and its cache entry weighs them once: 300 sessions of six
    turns of five memories fit the default budget, none decoded again (before, each weighed
    about five times its keyword size and the cache thrashed)."""
    import base64
    import dataclasses
    import sys

    from memdiag.settings import Settings
    from memdiag.streams.session.records import encode
    from memdiag.streams.session.session import vector_bytes
    from tests.inmemory import STATE, World

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    from semantic import make_events

    w = World(dataclasses.replace(Settings(), detector="semantic"))
    w.publish(make_events(300, 6))
    w.run(max_batch=1000)
    states = w.processor.states
    assert states.decoded == 0
    session = next(iter(states._cache._values.values()))
    for rec in session.records:
        vectors = getattr(rec, "vectors", None)
        if vectors is None:
            continue
        stored = encode([rec])
        each = [vectors] if isinstance(vectors, bytes) else list(vectors)
        assert all(b'"' + base64.b64encode(v) + b'"' in stored for v in each)
        assert vector_bytes(rec) == sum(len(base64.b64encode(v)) + 2 for v in each)
    assert session.vector_bytes == sum(map(vector_bytes, session.records)) > 0
    states.forget_decoded()
    store = w.runner.checkpoint.view(STATE)
    again = states.load(session.session_id, session.partition, store)
    assert again is not None and again.vector_bytes == session.vector_bytes


# -- turns from spans under the semantic rule ----------------------------------------------


def _search_span(n: int, source: str | None = None) -> dict:
    import json as _json

    records = _json.dumps([{"id": f"m{i}", "content": f"Rotate key {i}. Pin build {i}."}
                           for i in range(n)])  # fmt: skip
    attrs = {"gen_ai.operation.name": "search_memory", "gen_ai.memory.records": records,
             "gen_ai.memory.query.text": "keys"}  # fmt: skip
    if source is not None:
        attrs["memdiag.source"] = source
    return attrs


def test_a_search_span_carries_its_documents_vectors_within_a_bound(model: sm.Model) -> None:
    """An agent's search span carries each document's vectors (base64); a viewer's, which
    injects nothing, none; and a span whose vectors would pass MAX_VECTOR_CHARS none (its
    turn is judged by the words), however many documents it has."""
    from memdiag.streams.rules import spans as sp

    def read(attrs: dict) -> dict:
        rec, problem = sp.read_span("t" * 32, "s" * 16, "", 10, 20, attrs, {}, False, [], "",
                                    lambda text, remember: model.vectors(text))  # fmt: skip
        assert problem is None
        return rec

    rec = read(_search_span(3))
    assert len(rec["dv"]) == len(rec["docs"]) == 3 and "_texts" not in rec
    assert base64.b64decode(rec["dv"][0]) == model.vectors("Rotate key 0. Pin build 0.")
    assert "dv" not in read(_search_span(3, "viewer"))
    per_doc = len(rec["dv"][0])
    many = sp.MAX_VECTOR_CHARS // per_doc + 1
    big = read(_search_span(many))
    assert len(big["docs"]) == many and "dv" not in big and "_texts" not in big


@pytest.mark.parametrize(
    "vectors",
    ["AAAA", "not base64!", 7, ["AAAA"], None, [None], "A" * 343 + "="],
)
def test_malformed_vectors_on_an_internal_topic_fall_back_to_the_words(vectors: object) -> None:
    """A span record whose vectors are not whole rows of base64 is judged by the keyword rule
    (the trace stage never sends such; one that did must not poison the session)."""
    from memdiag.streams.session.records import span_record_of

    turn = span_record_of({"kind": "span_turn", "id": "T", "ts": 1, "end": 2,
                           "words": ["rotate"], "vectors": vectors}, 0)  # fmt: skip
    retrieval = span_record_of({"kind": "span_retrieval", "id": "R", "ts": 1,
                                "observations": [["m", ["rotate"]]], "vectors": vectors}, 0)  # fmt: skip
    assert turn.vectors is None and retrieval.vectors is None


def test_a_span_turn_mixing_embedded_and_unembedded_results_reads_the_same_replayed(
    model: sm.Model,
) -> None:
    """A turn's retrievals from before and after the switch to the semantic rule: each memory
    is judged with its own vectors or by the words, the same when the late retrieval extends
    the judged turn as when the log is replayed; the session weighs every vector it holds."""
    from memdiag.contract.envelope import Output
    from memdiag.streams.session.session import Config, Session, vector_bytes

    def b64(text: str) -> str:
        return base64.b64encode(model.vectors(text)).decode()

    said = "The auth token's signing secret must be rolled ahead of expiry."
    turn = {
        "kind": "span_turn",
        "id": "T",
        "ts": 100,
        "end": 200,
        "words": sorted({w for w in said.lower().split() if len(w) > 4}),
        "vectors": b64(said),
    }
    r1 = {
        "kind": "span_retrieval",
        "id": "R1",
        "ts": 50,
        "observations": [["plain", ["signing", "rotate"]]],
    }  # before the switch: no vectors
    r2 = {"kind": "span_retrieval", "id": "R2", "ts": 60,
          "observations": [["para", ["rotate", "signing", "expires", "token"]]],
          "vectors": [b64("Rotate the signing key before the token expires.")]}  # fmt: skip
    config = Config(30_000_000, 86_400_000_000, 3_600_000_000, similarity_threshold=0.19)
    live = Session("s", 0, config)
    for d in (r1, turn, r2):  # R2 comes late: it extends the judged turn
        live.ingest_span(d, (None, None, None), Output())
    again = Session("s", 0, config)
    again.replay(list(live.records))
    verdicts = {o: (j.feedback.detector, j.feedback.similarity)
                for o, j in live.turns["T"].judged.items()}  # fmt: skip
    assert verdicts == {o: (j.feedback.detector, j.feedback.similarity)
                        for o, j in again.turns["T"].judged.items()}  # fmt: skip
    assert verdicts["plain"] == ("keyword", None) and verdicts["para"][0] == "semantic"
    assert live.vector_bytes == again.vector_bytes == sum(map(vector_bytes, live.records)) > 0
