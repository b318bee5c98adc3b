-- How many of one agent's probed memories missed their latest name probe (SRR's misses).
SELECT count(*) FILTER (WHERE NOT hit) AS missed
FROM (SELECT hit FROM recall_probe_events WHERE agent_id = $agent_id AND query_source = 'name'
      QUALIFY row_number() OVER (PARTITION BY memory_id ORDER BY ts DESC, event_id DESC) = 1);
