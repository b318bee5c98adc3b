"""Analytics benchmark: the two table macros on 10 million sessions, against PostgreSQL.

    .venv/bin/python benchmarks/analytics.py [--rows 10000000] [--skip-postgres]

Data (deterministic): ``--rows`` session diagnostics over 30 days, 3 orgs, 7 projects,
60% accepted; each session injected 2 to 20 observations out of 100,000, and a failed
session sometimes one of 300 stale observations (the misleading ones to find). memdiag's
DuckDB file is filled through its own schema (with the ``observation_outcome_days``
rollup the sink keeps, built here in bulk and timed).

Baseline, in the same run: the seed design, the same rows in PostgreSQL 15 (Debian's
package, started by this script on loopback in a temporary directory), the ids in a
JSONB array, an index on (org_id, ts), and the misleading query through
``jsonb_array_elements_text``. Both engines must return the same rows; each query is
timed warm, median of 5. Target: each macro under 1 s, and faster than PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb  # noqa: E402

from memdiag.analytics.db import init_schema, sql  # noqa: E402

FILL = """
INSERT INTO session_diagnostics (session_id, outcome, failure_category, injected_observation_ids,
    injected_graph_entity_ids, injected_graph_edge_keys, helpful_observation_ids,
    misleading_observation_ids, ignored_observation_ids, search_count, followup_count, ts,
    org_id, project_id, event_id)
SELECT 'ses_' || i,
       CASE WHEN h < 60 THEN 'accepted' WHEN h < 85 THEN 'rejected' ELSE 'rework' END,
       CASE WHEN h < 60 THEN NULL
            ELSE ['test_failure', 'style', 'regression', 'incomplete', 'wrong_approach',
                  'other'][1 + (hash(i * 7) % 6)::INT] END,
       list_transform(range(2 + (hash(i) % 19)::INT),
                      lambda k: 'obs_' || lpad(CAST(hash(i * 31 + k) % $observations AS VARCHAR), 6, '0'))
         || CASE WHEN h >= 60 AND hash(i * 13) % 100 < 3
                 THEN ['obs_stale_' || CAST(hash(i * 17) % 300 AS VARCHAR)] ELSE [] END,
       [], [], [], [], [], 1 + (hash(i * 5) % 6)::INT, (hash(i * 3) % 3)::INT,
       TIMESTAMPTZ '2026-10-01 00:00:00+00' + to_seconds(CAST(i * $spacing AS BIGINT)),
       'org_' || (i % 3), 'proj_' || (i % 7), 'ev_' || i
FROM (SELECT i, CAST(hash(i) % 100 AS INTEGER) AS h FROM range($rows) t(i))
"""

QUERIES = {
    "failure_category_distribution()": (
        "SELECT * FROM failure_category_distribution()",
        "distribution",
        {"org": None, "since": None},
    ),
    "failure_category_distribution(org, since)": (
        "SELECT * FROM failure_category_distribution(org_id := 'org_1', since := '2026-10-15 13:00:00+00')",
        "distribution",
        {"org": "org_1", "since": "2026-10-15 13:00:00+00"},
    ),
    "misleading_observations()": (
        "SELECT * FROM misleading_observations()",
        "misleading",
        {"org": None, "since": None},
    ),
    "misleading_observations(org, since)": (
        "SELECT * FROM misleading_observations(org_id := 'org_1', since := '2026-10-15 13:00:00+00')",
        "misleading",
        {"org": "org_1", "since": "2026-10-15 13:00:00+00"},
    ),
}

#: The same question without the rollup: unnest every session's ids (what the macro did first).
DUCK_UNNEST = """
SELECT observation_id,
       count(*) FILTER (WHERE outcome <> 'accepted') AS fail_count,
       count(*) FILTER (WHERE outcome = 'accepted') AS success_count
FROM (SELECT unnest(injected_observation_ids) AS observation_id, outcome
      FROM session_diagnostics
      WHERE ($org IS NULL OR org_id = $org) AND ($since IS NULL OR ts >= CAST($since AS TIMESTAMPTZ)))
GROUP BY 1
HAVING count(*) FILTER (WHERE outcome <> 'accepted') >= 3
   AND count(*) FILTER (WHERE outcome = 'accepted') = 0
ORDER BY fail_count DESC, observation_id
"""

PG_SCHEMA = """
CREATE TABLE session_diagnostics (
    session_id text PRIMARY KEY,
    outcome text NOT NULL,
    failure_category text,
    injected_observation_ids jsonb NOT NULL,
    ts timestamptz NOT NULL,
    org_id text,
    project_id text
);
"""
PG_INDEX = (
    "CREATE INDEX ON session_diagnostics (org_id, ts)",
    "VACUUM ANALYZE session_diagnostics",
)
PG_DISTRIBUTION = """
WITH categories(failure_category, ord) AS (
    VALUES ('test_failure', 1), ('style', 2), ('regression', 3), ('incomplete', 4),
           ('wrong_approach', 5), ('other', 6), ('unknown', 7)),
counted AS (
    SELECT CASE WHEN failure_category IN ('test_failure', 'style', 'regression', 'incomplete',
                'wrong_approach', 'other') THEN failure_category ELSE 'unknown' END AS failure_category,
           count(*) AS sessions
    FROM session_diagnostics
    WHERE outcome IN ('rejected', 'rework')
      AND (%(org)s::text IS NULL OR org_id = %(org)s::text)
      AND (%(since)s::timestamptz IS NULL OR ts >= %(since)s::timestamptz)
    GROUP BY 1)
SELECT c.failure_category, coalesce(n.sessions, 0) AS sessions
FROM categories c LEFT JOIN counted n USING (failure_category) ORDER BY c.ord
"""
PG_MISLEADING = """
SELECT obs AS observation_id,
       count(*) FILTER (WHERE outcome <> 'accepted') AS fail_count,
       count(*) FILTER (WHERE outcome = 'accepted') AS success_count
FROM session_diagnostics d, jsonb_array_elements_text(d.injected_observation_ids) AS obs
WHERE (%(org)s::text IS NULL OR d.org_id = %(org)s::text)
  AND (%(since)s::timestamptz IS NULL OR d.ts >= %(since)s::timestamptz)
GROUP BY obs
HAVING count(*) FILTER (WHERE outcome <> 'accepted') >= 3
   AND count(*) FILTER (WHERE outcome = 'accepted') = 0
ORDER BY fail_count DESC, observation_id
"""


def timed(fn: Callable[[], Any], repeat: int = 5) -> tuple[float, Any]:
    fn()  # warm
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- DuckDB -------------------------------------------------------------------------------


def build_duckdb(path: Path, rows: int, observations: int) -> dict[str, float]:
    con = duckdb.connect(str(path))
    try:
        init_schema(con)
        t0 = time.perf_counter()
        # 30 days of sessions whatever the row count
        con.execute(
            FILL, {"rows": rows, "observations": observations, "spacing": 30 * 86400 / rows}
        )
        fill = time.perf_counter() - t0
        t0 = time.perf_counter()
        con.execute(sql("rebuild_observation_outcome_days"))
        rollup = time.perf_counter() - t0
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return {"fill": fill, "rollup": rollup}


# -- PostgreSQL ---------------------------------------------------------------------------


class Postgres:
    """A throwaway PostgreSQL 15 on loopback, in its own directory."""

    BIN = Path("/usr/lib/postgresql/15/bin")

    def __init__(self, workdir: Path):
        self.dir = workdir / "pg"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0  # postgres refuses to run as root

    def _run(self, *cmd: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_postgres else []
        subprocess.run([*prefix, *cmd], check=True, capture_output=True, text=True)

    def __enter__(self) -> Postgres:
        if not (self.BIN / "initdb").exists():
            raise SystemExit(
                "PostgreSQL 15 is not installed: `apt-get install postgresql-15`, "
                "or pass --skip-postgres"
            )
        self.dir.mkdir(parents=True)
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
            os.chmod(self.dir.parent, 0o755)  # noqa: S103 - the postgres user must reach its dir
        self._run(
            str(self.BIN / "initdb"), "-D", str(self.dir / "data"), "-U", "bench", "-A", "trust"
        )
        self._run(
            str(self.BIN / "pg_ctl"),
            "-D",
            str(self.dir / "data"),
            "-l",
            str(self.dir / "log"),
            "-w",
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c shared_buffers=4GB -c work_mem=256MB "
            "-c max_parallel_workers_per_gather=2 -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_wal_size=8GB",
            "start",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(str(self.BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "stop")

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="bench", dbname="postgres", autocommit=True
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_postgres(pg: Postgres, duck_path: Path, workdir: Path) -> dict[str, float]:
    csv = workdir / "sessions.csv"
    t0 = time.perf_counter()
    with duckdb.connect(str(duck_path), read_only=True) as con:
        con.execute(
            f"COPY (SELECT session_id, outcome, failure_category, "  # noqa: S608 - our own temp path
            "to_json(injected_observation_ids) AS ids, ts, org_id, project_id "
            f"FROM session_diagnostics) TO '{csv}' (HEADER false)"
        )
    export = time.perf_counter() - t0
    with pg.connect() as con:
        con.execute(PG_SCHEMA)
        t0 = time.perf_counter()
        with (
            con.cursor().copy(
                "COPY session_diagnostics (session_id, outcome, failure_category, "
                "injected_observation_ids, ts, org_id, project_id) FROM STDIN WITH (FORMAT csv)"
            ) as copy,
            csv.open("rb") as f,
        ):
            while chunk := f.read(8 << 20):
                copy.write(chunk)
        load = time.perf_counter() - t0
        t0 = time.perf_counter()
        for statement in PG_INDEX:
            con.execute(statement)
        index = time.perf_counter() - t0
    csv.unlink()
    return {"export": export, "load": load, "index": index}


def normalise(rows: list[Any]) -> list[tuple]:
    return [tuple(int(v) if isinstance(v, int) else v for v in r) for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--observations", type=int, default=100_000)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="memdiag-bench-", dir=args.dir))
    try:
        duck_path = workdir / "bench.duckdb"
        say(f"filling DuckDB with {args.rows:,} session diagnostics ...")
        build = build_duckdb(duck_path, args.rows, args.observations)
        con = duckdb.connect(str(duck_path), read_only=True)
        pairs, distinct = con.execute(
            "SELECT sum(len(injected_observation_ids)), "
            "(SELECT count(DISTINCT observation_id) FROM observation_outcome_days) "
            "FROM session_diagnostics"
        ).fetchone()  # type: ignore[misc]
        print(
            f"{args.rows:,} sessions, {pairs:,} (session, observation) pairs, "
            f"{distinct:,} distinct observations; DuckDB fill {build['fill']:.1f} s, "
            f"rollup build {build['rollup']:.1f} s"
        )
        duck: dict[str, tuple[float, Any]] = {}
        unnest: dict[str, float] = {}
        for name, (query, kind, params) in QUERIES.items():
            duck[name] = timed(lambda q=query: con.execute(q).fetchall())
            if kind == "misleading":
                seconds, rows = timed(lambda p=params: con.execute(DUCK_UNNEST, p).fetchall(), 3)
                assert normalise(rows) == normalise(duck[name][1]), name
                unnest[name] = seconds
        con.close()

        pg_times: dict[str, tuple[float, Any]] = {}
        if not args.skip_postgres:
            say("starting PostgreSQL 15 and loading the same rows ...")
            with Postgres(workdir) as pg:
                load = load_postgres(pg, duck_path, workdir)
                print(
                    f"PostgreSQL load: COPY {load['load']:.1f} s, index and analyze "
                    f"{load['index']:.1f} s"
                )
                with pg.connect() as pcon:
                    for name, (_, kind, params) in QUERIES.items():
                        q = PG_DISTRIBUTION if kind == "distribution" else PG_MISLEADING
                        pg_times[name] = timed(
                            lambda q=q, p=params: pcon.execute(q, p).fetchall(), repeat=3
                        )

        print()
        print(f"{'query':<44} {'DuckDB':>9} {'PostgreSQL':>11} {'PG / DuckDB':>12}  rows")
        for name, (seconds, rows) in duck.items():
            line = f"{name:<44} {seconds:>8.3f}s"
            if name in pg_times:
                pg_seconds, pg_rows = pg_times[name]
                same = normalise(rows) == normalise(pg_rows)
                line += f" {pg_seconds:>10.3f}s {pg_seconds / seconds:>11.1f}x  {len(rows)}"
                line += "" if same else "  RESULTS DIFFER"
                if not same:
                    print(line)
                    print(f"  duckdb: {rows[:5]}\n  postgres: {pg_rows[:5]}")
                    return 1
            else:
                line += f" {'-':>11} {'-':>12}  {len(rows)}"
            print(line)
        slow = [n for n, (s, _) in duck.items() if s >= 1.0]
        for name, seconds in unnest.items():
            print(
                f"  {name}: {seconds:.3f}s without the rollup (unnest every session), "
                f"{seconds / duck[name][0]:.1f}x the macro"
            )
        print()
        print("target (each macro < 1 s): " + ("met" if not slow else f"NOT met: {slow}"))
        if pg_times:
            behind = [n for n in duck if pg_times[n][0] <= duck[n][0]]
            print(
                "target (faster than PostgreSQL): "
                + ("met" if not behind else f"NOT met: {behind}")
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
