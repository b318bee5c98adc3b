-- The semantic rule's verdicts (detector = 'semantic'), per signal and per the rule that made
-- them: `keyword_used` is the keyword rule on the stored counts (more than 30% of the
-- keywords matched, in integers: contract section 3), so a `used` verdict it does not give
-- was made by the similarity alone. The rows with keyword_used NULL are the signal's total.
SELECT signal,
       CASE WHEN grouping(keyword_used) = 0 THEN keyword_used END AS keyword_used,
       grouping(keyword_used) = 1 AS total,
       count(*) AS verdicts,
       count(similarity) AS scored,
       min(similarity) AS min,
       quantile_cont(similarity, [0.1, 0.25, 0.5, 0.75, 0.9]) AS quantiles,
       max(similarity) AS max
FROM (
    SELECT signal, similarity,
           keyword_count > 0 AND matched_count * 10 > keyword_count * 3 AS keyword_used
    FROM retrieval_feedback
    WHERE detector = 'semantic'
      AND ($org_id IS NULL OR org_id = $org_id)
      AND ($project_id IS NULL OR project_id = $project_id)
      AND ($since IS NULL OR ts >= CAST($since AS TIMESTAMPTZ))
)
GROUP BY GROUPING SETS ((signal), (signal, keyword_used))
ORDER BY signal DESC, total DESC, keyword_used DESC;
