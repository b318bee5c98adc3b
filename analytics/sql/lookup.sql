-- For an id not among the ids of a kind (the `ids` CTE, from analytics/sql/ids_KIND.sql):
-- how many there are, and the closest few by Jaro-Winkler similarity (case folded), what an
-- unknown id's message offers.
SELECT bool_or(id = $id) AS found,
       count(*) AS known,
       list(id ORDER BY jaro_winkler_similarity(lower(id), lower($id)) DESC, id)[1:$n] AS closest
FROM ids
WHERE id IS NOT NULL
