-- The machine table's free-text search reads one precomputed column instead of eight LOWER()s
-- and a sub-query over the NICs per machine: host name, serial, asset tag, manufacturer, model,
-- site, rack, cluster, then every NIC's MAC and IPv4 in order, lower-cased, one a line. Written by
-- the store with the machine (`MachineSpec::search_text`); existing rows are filled here the same
-- way. Keep in step with migrations/postgres/0021_machine_search.sql.
ALTER TABLE machines ADD COLUMN search_text TEXT NOT NULL DEFAULT '';
UPDATE machines SET search_text =
    lower(coalesce(hostname, '')) || char(10) || lower(coalesce(serial, '')) || char(10) ||
    lower(coalesce(asset_tag, '')) || char(10) || lower(coalesce(manufacturer, '')) || char(10) ||
    lower(coalesce(model, '')) || char(10) || lower(coalesce(site, '')) || char(10) ||
    lower(coalesce(rack, '')) || char(10) || lower(coalesce(cluster, '')) ||
    coalesce((SELECT group_concat(char(10) || n.mac || char(10) || coalesce(n.ipv4, ''), '')
              FROM (SELECT mac, ipv4 FROM interfaces i WHERE i.machine_id = machines.id
                    ORDER BY i.position) n), '');
