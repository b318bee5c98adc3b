"""The similarity the semantic used/ignored rule reads (``MEMDIAG_DETECTOR=semantic``): a
static sentence embedding, run offline and the same to the bit on every machine.

The model. WordLlama's ``l2_supercat`` at 256 dimensions (wordllama 0.4.0.post1, MIT): a
table of one float16 vector per token of LLaMA 2's tokenizer, trained so that the mean of a
text's token vectors embeds the text. Its two files ship inside the ``wordllama`` wheel
(``pip install 'memdiag[semantic]'``); memdiag finds them without importing the package
(importing it configures the root logger), checks each against the sha256 below, reads the
tokenizer with ``tokenizers`` and maps the table straight from the safetensors file. Nothing
is downloaded and nothing is written, at load or after.

Why this one (issue #39): no torch, 16 MB of weights, and a turn of ten memories in well
under a millisecond on one core, where the small ONNX MiniLM scored paraphrases a little
better at about 64 ms a turn, too slow for the stream. Its weights were distilled from the
token-embedding codebooks of LLaMA 2 70B and phi-3-medium (its README); the package, weights
included, is MIT.

A text's vectors. A text is cut into sentences (after ``.``, ``!`` or ``?`` ending a word,
and at each line break); each vector is the sum of its tokens' rows (the mean's direction),
stored as 256 signed bytes (``rint(127 * v / max|v|)``). :func:`Model.vectors` gives the
whole text's vector, then each sentence's when there are two or more (at most
:data:`MAX_ROWS` rows: later sentences join the last one). A use often sits in one sentence
of a long answer, and against the whole text it scores little (0.37 against 0.52 for its
sentence, in the issue's example).

The similarity of two texts (:func:`similarity`) is the largest cosine between a row of
one and a row of the other, clipped to [0, 1] and rounded to 6 places.

The same on every machine. Every float16 weight is a multiple of 2^-24 no larger than 8.02,
so its float64 sums are exact in any order (below 2^29); a byte row follows by one
multiplication, one division and ``rint``, each correctly rounded (IEEE 754); a cosine of
two byte rows is an exact integer dot product over one correctly rounded square root and a
division. No step depends on the machine, the BLAS or the thread count; the load checks it
on a fixed text (:data:`PROBE_SHA256`), which also pins what the ``tokenizers`` library
makes of the tokenizer's file.

Bounded work. Only the first :data:`MAX_CHARS` characters of a text are embedded, and a
word longer than :data:`MAX_WORD` characters is read as pieces of that length: an event
of a megabyte costs what 32 KB cost, and tokenising one very long word (which grows faster
than its length) never stalls the worker.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

#: The package whose wheel carries the files, and its version (the checksums are its files').
PACKAGE, VERSION = "wordllama", "0.4.0.post1"
WEIGHTS = "weights/l2_supercat_256.safetensors"
WEIGHTS_SHA256 = "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5"
TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
TOKENIZER_SHA256 = "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68"
DIMS = 256
#: The most rows a text keeps: the whole, then up to 15 sentences (256 bytes each).
MAX_ROWS = 16
#: Words whose token ids are remembered (a word's ids never change): about 4 MB at most.
WORD_CACHE = 50_000
#: The characters of a text that are embedded (its start), and the longest word read whole.
MAX_CHARS = 32_768
MAX_WORD = 64
#: A fixed text's rows, checked at every load.
PROBE = "Rotate the signing key before the token expires. Then deploy: canary first!"
PROBE_SHA256 = "9d7806545f080b15f4fdd024916c4e8f0230faddec711d880d54fd7f49b4d7c9"

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")


class ModelMissing(RuntimeError):
    """The model's files are not installed, or not the ones memdiag was tested with: the
    message says what to do."""


def _locate() -> Path:
    spec = importlib.util.find_spec(PACKAGE)  # finds it without running it
    if spec is None or not spec.submodule_search_locations:
        raise ModelMissing(
            f"MEMDIAG_DETECTOR=semantic needs the similarity model, shipped inside the "
            f"{PACKAGE} package: pip install 'memdiag[semantic]' (or unset MEMDIAG_DETECTOR "
            "for the keyword rule)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _checked(path: Path, sha256: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelMissing(
            f"cannot read the similarity model's file {path}: {exc}. "
            f"Reinstall it: pip install '{PACKAGE}=={VERSION}'"
        ) from None
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise ModelMissing(
            f"{path} is not the file memdiag was tested with (sha256 {found[:12]}..., "
            f"expected {sha256[:12]}...): install {PACKAGE}=={VERSION}, whose similarities "
            "memdiag's thresholds were chosen on"
        )
    return data


class Model:
    """The loaded model (:func:`model` gives the process's one): thread-safe to read."""

    def __init__(self, root: Path | None = None):
        try:
            import numpy as np
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelMissing(
                f"MEMDIAG_DETECTOR=semantic needs numpy and tokenizers ({exc.name} is "
                "missing): pip install 'memdiag[semantic]'"
            ) from None
        self._np = np
        root = _locate() if root is None else root
        tokenizer = _checked(root / TOKENIZER, TOKENIZER_SHA256)
        weights = _checked(root / WEIGHTS, WEIGHTS_SHA256)
        try:
            self._tokenizer = Tokenizer.from_str(tokenizer.decode("utf-8"))
            self._tokenizer.no_padding()
            self._tokenizer.no_truncation()
            (size,) = struct.unpack("<Q", weights[:8])
            header = json.loads(weights[8 : 8 + size])["embedding.weight"]
            begin, end = header["data_offsets"]
            rows, dims = header["shape"]
        except Exception as exc:  # noqa: BLE001 - the files pass their checksums: a library
            raise ModelMissing(  # that reads them otherwise than the tested one
                f"cannot read the similarity model with this tokenizers library ({exc!r}): "
                f"pip install 'memdiag[semantic]' for the versions memdiag was tested with"
            ) from None
        if header["dtype"] != "F16" or dims != DIMS or end - begin != rows * dims * 2:
            raise ModelMissing(f"unexpected weights in {root / WEIGHTS}: {header}")
        start = 8 + size + begin
        table = np.frombuffer(weights, dtype="<f2", count=rows * dims, offset=start)
        self._table = table.reshape(rows, dims)
        self._words: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()
        probe = hashlib.sha256(self.vectors(PROBE)).hexdigest()
        if probe != PROBE_SHA256:
            raise ModelMissing(
                f"the similarity model embeds a fixed text otherwise than memdiag was tested "
                f"with (sha256 {probe[:12]}..., expected {PROBE_SHA256[:12]}...): its "
                "similarities would differ from other machines'. Install the tested "
                "versions: pip install 'memdiag[semantic]'"
            )

    def _ids(self, word: str) -> tuple[int, ...]:
        ids = self._words.get(word)
        if ids is None:
            ids = tuple(self._tokenizer.encode(word, add_special_tokens=False).ids)
            with self._lock:
                if len(self._words) >= WORD_CACHE:
                    self._words.clear()
                self._words[word] = ids
        return ids

    def tokens(self, text: str) -> list[list[int]]:
        """The token ids of each sentence of ``text`` (see the module docstring)."""
        sentences: list[list[int]] = []
        for line in text[:MAX_CHARS].splitlines():
            current: list[int] = []
            for word in line.split():
                if len(word) <= MAX_WORD:
                    current.extend(self._ids(word))
                else:
                    for i in range(0, len(word), MAX_WORD):
                        current.extend(self._ids(word[i : i + MAX_WORD]))
                if _SENTENCE_END.search(word) and current:
                    sentences.append(current)
                    current = []
            if current:
                sentences.append(current)
        if len(sentences) > MAX_ROWS - 1:
            last = [i for s in sentences[MAX_ROWS - 2 :] for i in s]
            sentences = [*sentences[: MAX_ROWS - 2], last]
        return sentences

    def vectors(self, text: str) -> bytes:
        """The text's rows (256 signed bytes each): the whole, then each sentence when
        there are two or more. Empty: nothing to embed (no similarity)."""
        np = self._np
        sentences = self.tokens(text)
        if not sentences:
            return b""
        # One gather, and every row's sum in one product with a 0/1 matrix (the whole text,
        # then each sentence): every partial sum is exact (module docstring), so neither the
        # order of the additions nor the BLAS changes a bit.
        ids = np.array([i for s in sentences for i in s], dtype=np.intp)
        tokens = self._table.take(ids, axis=0).astype(np.float64)
        if len(sentences) == 1:
            rows = tokens.sum(axis=0, keepdims=True)
        else:
            pick = np.zeros((len(sentences) + 1, len(ids)))
            pick[0] = 1.0
            at = 0
            for k, sentence in enumerate(sentences, 1):
                pick[k, at : at + len(sentence)] = 1.0
                at += len(sentence)
            rows = pick @ tokens
        tops = np.abs(rows).max(axis=1)
        kept = tops > 0.0
        return np.rint(rows[kept] * 127.0 / tops[kept][:, None]).astype(np.int8).tobytes()


def similarity(a: bytes, b: bytes) -> float:
    """The largest cosine between a row of ``a`` and a row of ``b`` (each from
    :meth:`Model.vectors`), clipped to [0, 1], rounded to 6 places; 0.0 when either is
    empty. Each cosine is an exact integer dot product (float64 holds every partial sum of
    256 products of bytes exactly) over the correctly rounded square root of the exact
    product of the two exact squared norms: the same on every machine."""
    if not a or not b:
        return 0.0
    import numpy as np

    rows_a, norms_a = _parsed(a)
    rows_b, norms_b = _parsed(b)
    cosines = (rows_a @ rows_b.T) / np.sqrt(np.multiply.outer(norms_a, norms_b))
    return round(min(max(float(cosines.max()), 0.0), 1.0), 6)


def similarities(memories: list[bytes], response: bytes) -> list[float]:
    """:func:`similarity` of each of ``memories`` with ``response``, in one product: the
    same arithmetic on each pair (each cosine is computed alone, from exact integers), so
    each value equals :func:`similarity`'s to the bit."""
    import numpy as np

    if not response:
        return [0.0] * len(memories)
    rows_r, norms_r = _parsed(response)
    present = [m for m in memories if m]
    if not present:
        return [0.0] * len(memories)
    parsed = [_parsed(m) for m in present]
    rows = np.concatenate([r for r, _ in parsed]) if len(parsed) > 1 else parsed[0][0]
    norms = np.concatenate([n for _, n in parsed]) if len(parsed) > 1 else parsed[0][1]
    cosines = (rows @ rows_r.T) / np.sqrt(np.multiply.outer(norms, norms_r))
    starts = np.cumsum([0] + [len(n) for _, n in parsed[:-1]])
    best = np.maximum.reduceat(cosines.max(axis=1), starts).tolist()
    found = iter(best)
    return [round(min(max(next(found), 0.0), 1.0), 6) if m else 0.0 for m in memories]


#: Parsed rows remembered by their bytes (a memory's come again in turn after turn, and a
#: response's are read once per memory of its turn), up to about 8 MB of float64 rows.
_PARSED: dict[bytes, Any] = {}
_PARSED_BYTES = [0]
PARSED_CACHE_BYTES = 8 << 20


def _parsed(v: bytes) -> Any:
    """A text's rows as float64 (exact: they are bytes) and their squared norms (exact)."""
    got = _PARSED.get(v)
    if got is None:
        import numpy as np

        rows = np.frombuffer(v, dtype=np.int8).reshape(-1, DIMS).astype(np.float64)
        got = (rows, np.einsum("ij,ij->i", rows, rows))
        if _PARSED_BYTES[0] + rows.nbytes > PARSED_CACHE_BYTES:
            _PARSED.clear()
            _PARSED_BYTES[0] = 0
        _PARSED[v] = got
        _PARSED_BYTES[0] += rows.nbytes
    return got


_MODEL: Model | None = None
_MODEL_LOCK = threading.Lock()


def model() -> Model:
    """The process's model, loaded (and checked) on first use."""
    global _MODEL
    if _MODEL is None:
        with _MODEL_LOCK:
            if _MODEL is None:
                _MODEL = Model()
    return _MODEL


#: Texts whose rows :func:`embedder` remembers, by content hash, when no cache is given:
#: memory systems inject the same memories into many sessions. At most about 4 KB each (16
#: rows): 40 MB at worst, about 2.5 MB for memories of one or two sentences. The worker
#: gives its own cache instead, in its one byte budget (``MEMDIAG_DECODED_CACHE_MB``).
EMBED_CACHE = 10_000


class RowsCache(Protocol):
    """Where :func:`embedder` keeps a memory's rows (``memdiag.streams.lru.Cache``: the
    worker's byte budget, each entry weighing its bytes)."""

    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, value: bytes, encoded_bytes: int, raw_bytes: int) -> None: ...


class _Bounded:
    """A :class:`RowsCache` of the last ``entries`` texts (no budget given)."""

    def __init__(self, entries: int):
        self.entries = entries
        self._rows: OrderedDict[str, bytes] = OrderedDict()

    def get(self, key: str) -> bytes | None:
        rows = self._rows.get(key)
        if rows is not None:
            self._rows.move_to_end(key)
        return rows

    def put(self, key: str, value: bytes, encoded_bytes: int, raw_bytes: int) -> None:
        self._rows[key] = value
        if len(self._rows) > self.entries:
            self._rows.popitem(last=False)


#: What a remembered memory's rows cost beyond their bytes and key (the bytes object, the
#: key's string, the budget's slot and dict entries: measured with tracemalloc, about 280).
ENTRY_BYTES = 300


def installed() -> bool:
    """Whether memdiag[semantic] is installed (the model's package and what reads it); the
    model may still fail its checks at load (:class:`ModelMissing`)."""
    return all(importlib.util.find_spec(name) is not None
               for name in (PACKAGE, "numpy", "tokenizers"))  # fmt: skip


def embedder(
    entries: int = EMBED_CACHE, cache: RowsCache | None = None
) -> Callable[[str, bool], bytes]:
    """The process's model as a function (text, remember) -> rows. With ``remember`` (a
    memory's content: memory systems inject the same ones into many sessions) the text's
    rows are kept by its content hash, in ``cache`` (weighing their bytes) or else the last
    ``entries`` such texts; a response, which does not come again, is embedded and
    forgotten. The model is loaded, and checked, here: a worker that cannot load it stops at
    start with what to install."""
    m = model()
    kept: RowsCache = _Bounded(entries) if cache is None else cache
    # The worker calls it from its one processing thread only (a shared budget's order is
    # not locked: its other caches are written from that thread too); the lock keeps a
    # calibration or a test that embeds from several threads consistent.
    lock = threading.Lock()

    def embed(text: str, remember: bool = True) -> bytes:
        if not remember:
            return m.vectors(text)
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        with lock:
            rows = kept.get(key)
        if rows is not None:
            return rows
        rows = m.vectors(text)
        with lock:
            size = len(rows) + len(key) + ENTRY_BYTES
            kept.put(key, rows, size, size)
        return rows

    return embed


def describe() -> dict[str, Any]:
    """What the model is, for logs and ``--json``."""
    return {"package": PACKAGE, "version": VERSION, "weights": WEIGHTS,
            "weights_sha256": WEIGHTS_SHA256, "dims": DIMS}  # fmt: skip
