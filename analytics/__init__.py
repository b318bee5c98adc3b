"""The analyst's side: the DuckDB sink, its SQL, and the queries and reports on top."""
