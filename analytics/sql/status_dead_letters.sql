SELECT reason, count(*) AS dead_letters, max(ts) AS latest
FROM dead_letters GROUP BY reason ORDER BY dead_letters DESC, reason;
