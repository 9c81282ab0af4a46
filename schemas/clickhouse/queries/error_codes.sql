-- Which errors: failed requests by status and error code (HTTP status or the provider's
-- error type), from the raw requests. Parameters: from, to (DateTime), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed).
SELECT status, error_code, count() AS requests
FROM requests
WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND status != 'ok' AND layer = {layer:String}
GROUP BY status, error_code
ORDER BY requests DESC, status, error_code
