-- Each instance holds the lease table in memory (`src/store/lease_view.rs`) and follows what the
-- other instances write by reading the rows written since its last read. A row is stamped with the
-- transaction that wrote it (`pg_current_xact_id()`, a 64-bit id that never wraps); a reader asks
-- for rows stamped at or after the oldest transaction still running at its previous read
-- (`pg_snapshot_xmin`), so a row committed late, by a transaction that began before the read, is
-- still seen next time. The trigger stamps every write, the server's and anyone else's.
ALTER TABLE dhcp_leases ADD COLUMN write_xid xid8;

CREATE FUNCTION dhcp_leases_stamp_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.write_xid := pg_current_xact_id();
    RETURN NEW;
END
$$;

CREATE TRIGGER dhcp_leases_stamp_xid BEFORE INSERT OR UPDATE ON dhcp_leases
    FOR EACH ROW EXECUTE FUNCTION dhcp_leases_stamp_xid();

CREATE INDEX dhcp_leases_write_xid_idx ON dhcp_leases (write_xid);
