-- The machine table's free-text search reads one precomputed column instead of eight LOWER()s
-- and a sub-query over the NICs per machine: host name, serial, asset tag, manufacturer, model,
-- site, rack, cluster, then every NIC's MAC and IPv4 in order, lower-cased, one a line. Written by
-- the store with the machine (`MachineSpec::search_text`); existing rows are filled here the same
-- way. Keep in step with migrations/sqlite/0021_machine_search.sql.
ALTER TABLE machines ADD COLUMN search_text TEXT NOT NULL DEFAULT '';
UPDATE machines m SET search_text =
    lower(coalesce(hostname, '')) || E'\n' || lower(coalesce(serial, '')) || E'\n' ||
    lower(coalesce(asset_tag, '')) || E'\n' || lower(coalesce(manufacturer, '')) || E'\n' ||
    lower(coalesce(model, '')) || E'\n' || lower(coalesce(site, '')) || E'\n' ||
    lower(coalesce(rack, '')) || E'\n' || lower(coalesce(cluster, '')) ||
    coalesce((SELECT string_agg(E'\n' || i.mac || E'\n' || coalesce(i.ipv4, ''), '' ORDER BY i.position)
              FROM interfaces i WHERE i.machine_id = m.id), '');
