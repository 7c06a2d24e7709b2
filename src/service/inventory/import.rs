//! Bulk import, streamed: a CSV or JSON file of any number of rows is walked twice, row by row,
//! on a blocking thread (never on the runtime threads that answer boots): the first walk checks
//! every row (validation, unique values repeated in the file, values that belong to machines
//! already) and keeps only a 16-byte digest and a line per unique value; the second builds the
//! records in batches of [`IMPORT_BATCH`] (sealing BMC passwords) and hands them to the store,
//! which writes them all in one transaction as they come. Time is linear in the file, memory is
//! the file itself (bounded by `http.max_body_bytes`), the digests and one batch; never every row.
//! The documented contract holds: every bad row is reported and then nothing is imported, and a
//! crash at any moment leaves all rows or none.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::{bmc_moved, Inventory, RowError};
use crate::domain::import::{for_each_row, ImportFormat, ImportKey, ParsedRow};
use crate::domain::{spec_diff, unique_keys, MachineId, MachineRef, MachineSpec, UniqueKey};
use crate::service::error::ServiceError;
use crate::service::ports::{ImportBatch, ImportBatches, MachineUpdate, NewEvent, StoreError};

/// Rows in one batch of the write: bounds what an import holds at once and each step of its
/// transaction.
pub const IMPORT_BATCH: usize = 500;

/// Bad rows a refusal lists at most; past it they are counted in one last entry.
pub const MAX_ROW_ERRORS: usize = 1000;

/// Unique values looked up in the inventory per query.
const LOOKUP: usize = 2000;

/// What an import did.
#[derive(Clone, Debug, Default)]
pub struct ImportOutcome {
    /// Machines created (rows that matched none), in file order.
    pub created: Vec<MachineId>,
    /// With `update`: machines replaced by their row, in file order.
    pub updated: Vec<MachineId>,
    /// With `update`: rows that matched a machine already exactly like them.
    pub unchanged: usize,
}

/// The digest a unique value is remembered by while the file is checked (a 128-bit prefix of
/// SHA-256: the odds that two of a million values share one are about 1e-27).
fn digest(k: &UniqueKey) -> [u8; 16] {
    let d = Sha256::digest(format!("{k:?}").as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// The bad rows found so far, in file order: the first [`MAX_ROW_ERRORS`] and a count of the rest.
#[derive(Default)]
struct BadRows {
    list: Vec<RowError>,
    more: usize,
}

impl BadRows {
    fn push(&mut self, e: RowError) {
        self.list.push(e);
    }

    /// Once every row up to here is checked: keep the first rows' errors only.
    fn settle(&mut self) {
        if self.list.len() > MAX_ROW_ERRORS {
            self.list.sort_by_key(|e| e.line);
            self.more += self.list.len() - MAX_ROW_ERRORS;
            self.list.truncate(MAX_ROW_ERRORS);
        }
    }

    fn into_refusal(mut self) -> Option<ServiceError> {
        self.settle();
        if self.list.is_empty() {
            return None;
        }
        self.list.sort_by_key(|e| e.line);
        if self.more > 0 {
            self.list.push(RowError {
                line: 0,
                field: "-".into(),
                message: format!(
                    "and {} more error(s) in later rows (the first {MAX_ROW_ERRORS} are listed)",
                    self.more
                ),
            });
        }
        Some(ServiceError::ImportRejected(self.list))
    }
}

/// A row waiting for its unique values to be looked up.
struct Pending {
    line: usize,
    /// Its unique values (each the first of its kind in the file), with the field that holds it.
    keys: Vec<(String, UniqueKey)>,
    /// With `update`: the value that matches it to a machine.
    matches: Option<UniqueKey>,
}

/// The first walk: every check, no write.
struct Check<'a> {
    inventory: &'a Inventory,
    rt: &'a Handle,
    update: Option<ImportKey>,
    bad: BadRows,
    /// Digest of each unique value seen, and the line it was first on.
    seen: HashMap<[u8; 16], usize>,
    pending: Vec<Pending>,
    pending_keys: usize,
    failed: Option<StoreError>,
    rows: usize,
}

impl Check<'_> {
    fn row(&mut self, row: ParsedRow) {
        self.rows += 1;
        if self.failed.is_some() {
            return;
        }
        let spec = match row.spec.clone().and_then(|s| s.validate()) {
            Ok(spec) => spec,
            Err(e) => {
                for fe in e.0 {
                    self.bad.push(RowError {
                        line: row.line,
                        field: fe.field,
                        message: fe.message,
                    });
                }
                return;
            }
        };
        let matches = match self.update {
            None => None,
            Some(key) => match key.of(&spec) {
                Some(k) => Some(k),
                None => {
                    self.bad.push(RowError {
                        line: row.line,
                        field: row.field_name(key.field()),
                        message: "required: --update matches rows to machines by it".into(),
                    });
                    return;
                }
            },
        };
        let mut keys = Vec::new();
        for (path, k) in unique_keys(&spec) {
            let field = row.field_name(&path);
            match self.seen.get(&digest(&k)) {
                Some(first) => self.bad.push(RowError {
                    line: row.line,
                    field,
                    message: format!("{k} is also on line {first}"),
                }),
                None => {
                    self.seen.insert(digest(&k), row.line);
                    keys.push((field, k));
                }
            }
        }
        self.pending_keys += keys.len() + 1;
        self.pending.push(Pending {
            line: row.line,
            keys,
            matches,
        });
        if self.pending_keys >= LOOKUP {
            self.look_up();
        }
    }

    /// Look the pending rows' values up in the inventory: a value of another machine than the
    /// one the row replaces is a bad row.
    fn look_up(&mut self) {
        let rows = std::mem::take(&mut self.pending);
        self.pending_keys = 0;
        if rows.is_empty() || self.failed.is_some() {
            return;
        }
        let keys: Vec<UniqueKey> = rows
            .iter()
            .flat_map(|p| {
                p.keys
                    .iter()
                    .map(|(_, k)| k.clone())
                    .chain(p.matches.clone())
            })
            .collect();
        let owners: HashMap<UniqueKey, MachineRef> =
            match self.rt.block_on(self.inventory.machines.owners(&keys)) {
                Ok(o) => o.into_iter().collect(),
                Err(e) => {
                    self.failed = Some(e);
                    return;
                }
            };
        for p in rows {
            let replaces = p.matches.as_ref().and_then(|k| owners.get(k)).map(|o| o.id);
            for (field, k) in p.keys {
                if let Some(owner) = owners.get(&k).filter(|o| Some(o.id) != replaces) {
                    self.bad.push(RowError {
                        line: p.line,
                        field,
                        message: format!(
                            "{k} already belongs to machine {} ({})",
                            owner.name, owner.id
                        ),
                    });
                }
            }
        }
        self.bad.settle();
    }
}

/// What the writer of an import is fed: a batch, the end (commit), or why it must stop.
type Feed = Result<Option<ImportBatch>, StoreError>;

/// The store's side of the feed. A feed that ends without saying so (its producer stopped) is an
/// error, never a commit.
struct Fed(mpsc::Receiver<Feed>);

#[async_trait]
impl ImportBatches for Fed {
    async fn next_batch(&mut self) -> Result<Option<ImportBatch>, StoreError> {
        match self.0.recv().await {
            Some(feed) => feed,
            None => Err(StoreError::Backend(
                "the import stopped before its end".into(),
            )),
        }
    }
}

impl Inventory {
    /// Import the machines of a CSV sheet or a JSON array (`body`, UTF-8) as one transaction.
    /// Without `update` every row creates a machine; with it, a row whose `update` value belongs
    /// to a machine replaces that machine's spec (state, id and history kept; a BMC password the
    /// row does not give is kept unless the BMC's origin moved), rows already like their machine
    /// are left alone, the others are created. Every bad row is reported (line, field, message;
    /// the first [`MAX_ROW_ERRORS`]) and then nothing changes: a row that does not validate, a
    /// row without the `update` value, a unique value repeated in the file, or one that belongs
    /// to a machine other than the row's own. See the module's paragraph for how it streams.
    pub async fn import(
        &self,
        format: ImportFormat,
        body: Vec<u8>,
        update: Option<ImportKey>,
        actor: &str,
    ) -> Result<ImportOutcome, ServiceError> {
        let rt = Handle::current();
        let text: Arc<str> = {
            let check = self.clone();
            let rt = rt.clone();
            tokio::task::spawn_blocking(move || -> Result<Arc<str>, ServiceError> {
                let text: Arc<str> = String::from_utf8(body)
                    .map_err(|e| {
                        let mut v = crate::domain::ValidationErrors::default();
                        v.push("body", format!("not UTF-8: {}", e.utf8_error()));
                        ServiceError::Invalid(v)
                    })?
                    .into();
                check.check_import(&rt, format, &text, update)?;
                Ok(text)
            })
            .await
            .map_err(|e| ServiceError::Store(StoreError::Backend(format!("import check: {e}"))))??
        };
        let (tx, rx) = mpsc::channel::<Feed>(2);
        let producer = {
            let this = self.clone();
            let actor = actor.to_string();
            tokio::task::spawn_blocking(move || {
                this.produce(&rt, format, &text, update, &actor, tx)
            })
        };
        let written = self.machines.import_batches(&mut Fed(rx), actor).await;
        let produced = producer
            .await
            .map_err(|e| ServiceError::Store(StoreError::Backend(format!("import: {e}"))))?;
        match written {
            Ok(()) => produced,
            Err(
                StoreError::Conflict(_) | StoreError::VersionMismatch { .. } | StoreError::NotFound,
            ) => Err(ServiceError::ImportRejected(vec![RowError {
                line: 0,
                field: "-".into(),
                message: "another writer changed the same machines or values meanwhile; \
                          nothing imported, retry"
                    .into(),
            }])),
            Err(e) => Err(e.into()),
        }
    }

    /// The first walk (on a blocking thread): `Ok` when every row may be written.
    fn check_import(
        &self,
        rt: &Handle,
        format: ImportFormat,
        text: &str,
        update: Option<ImportKey>,
    ) -> Result<(), ServiceError> {
        let mut check = Check {
            inventory: self,
            rt,
            update,
            bad: BadRows::default(),
            seen: HashMap::new(),
            pending: Vec::new(),
            pending_keys: 0,
            failed: None,
            rows: 0,
        };
        let started = std::time::Instant::now();
        for_each_row(format, text, &mut |row| check.row(row))
            .map_err(|e| ServiceError::ImportRejected(vec![e]))?;
        check.look_up();
        if let Some(e) = check.failed {
            return Err(e.into());
        }
        tracing::info!(
            rows = check.rows,
            bad = check.bad.list.len() + check.bad.more,
            took_ms = started.elapsed().as_millis() as u64,
            "import checked"
        );
        match check.bad.into_refusal() {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    /// The second walk (on a blocking thread): build the records batch by batch and feed them to
    /// the store's transaction, then say the import is whole. Any failure is fed too, so the
    /// store rolls back.
    fn produce(
        &self,
        rt: &Handle,
        format: ImportFormat,
        text: &str,
        update: Option<ImportKey>,
        actor: &str,
        tx: mpsc::Sender<Feed>,
    ) -> Result<ImportOutcome, ServiceError> {
        let mut out = ImportOutcome::default();
        let mut specs: Vec<MachineSpec> = Vec::with_capacity(IMPORT_BATCH);
        let mut failed: Option<StoreError> = None;
        let send = |specs: &mut Vec<MachineSpec>,
                    out: &mut ImportOutcome,
                    failed: &mut Option<StoreError>| {
            if failed.is_some() || specs.is_empty() {
                return;
            }
            let batch = self.batch(rt, std::mem::take(specs), update, actor, out);
            let feed = match batch {
                Ok(b) => Ok(Some(b)),
                Err(e) => {
                    *failed = Some(StoreError::Backend(e.to_string()));
                    Err(e)
                }
            };
            if tx.blocking_send(feed).is_err() && failed.is_none() {
                // The store stopped (its error is the import's).
                *failed = Some(StoreError::Backend("the store ended the import".into()));
            }
        };
        let walked = for_each_row(format, text, &mut |row| {
            if failed.is_some() {
                return;
            }
            match row.spec.and_then(|s| s.validate()) {
                Ok(spec) => specs.push(spec),
                Err(_) => {
                    failed = Some(StoreError::Backend(format!(
                        "line {} no longer validates",
                        row.line
                    )));
                    let _ = tx.blocking_send(Err(StoreError::Backend("import row changed".into())));
                    return;
                }
            }
            if specs.len() >= IMPORT_BATCH {
                send(&mut specs, &mut out, &mut failed);
            }
        });
        if let Err(e) = walked {
            let _ = tx.blocking_send(Err(StoreError::Backend(format!(
                "the file no longer reads: {}",
                e.message
            ))));
            return Err(ServiceError::ImportRejected(vec![e]));
        }
        send(&mut specs, &mut out, &mut failed);
        if let Some(e) = failed {
            return Err(e.into());
        }
        let _ = tx.blocking_send(Ok(None));
        Ok(out)
    }

    /// One batch: new machines for rows that match none, replacements for rows that match one
    /// and differ from it.
    fn batch(
        &self,
        rt: &Handle,
        specs: Vec<MachineSpec>,
        update: Option<ImportKey>,
        actor: &str,
        out: &mut ImportOutcome,
    ) -> Result<ImportBatch, StoreError> {
        let mut batch = ImportBatch::default();
        let owners: HashMap<UniqueKey, MachineRef> = match update {
            None => HashMap::new(),
            Some(key) => {
                let keys: Vec<UniqueKey> = specs.iter().filter_map(|s| key.of(s)).collect();
                rt.block_on(self.machines.owners(&keys))?
                    .into_iter()
                    .collect()
            }
        };
        for spec in specs {
            let matched = update
                .and_then(|key| key.of(&spec))
                .and_then(|k| owners.get(&k))
                .map(|o| o.id);
            let Some(id) = matched else {
                let id = MachineId::new();
                batch.creates.push((id, self.record(id, spec, false)));
                out.created.push(id);
                continue;
            };
            let current = rt
                .block_on(self.machines.get_machine(id))?
                .ok_or(StoreError::NotFound)?;
            let before = current.spec();
            let moved = bmc_moved(&current, &spec);
            let mut changes = spec_diff(Some(&before), Some(&spec));
            let password_given = spec.bmc.as_ref().is_some_and(|b| b.password.is_some());
            if changes.as_object().is_some_and(|c| c.is_empty()) && !password_given {
                out.unchanged += 1;
                continue;
            }
            if let (Some(m), Value::Object(c)) = (&moved, &mut changes) {
                c.insert(
                    "bmc.password".into(),
                    json!(format!(
                        "discarded: the BMC origin changed from {} to {}",
                        m.from, m.to
                    )),
                );
            }
            batch.updates.push(MachineUpdate {
                id,
                expected_version: current.version,
                rec: self.record(id, spec, moved.is_some()),
                event: NewEvent {
                    machine_id: Some(id),
                    kind: "machine.updated".into(),
                    actor: actor.into(),
                    detail: json!({"version": current.version + 1, "import": true, "changes": changes}),
                },
            });
            out.updated.push(id);
        }
        Ok(batch)
    }
}
