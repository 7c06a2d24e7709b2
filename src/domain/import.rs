//! Bulk-import formats: a CSV sheet (one machine a row, one boot NIC plus extra MACs, up to
//! [`CSV_MAX_DISKS`] disks in `diskN_*` columns) or a JSON array of machine specs. Parsing keeps
//! the line number of every row so that a refusal can name it.

use std::collections::HashMap;

use serde::Serialize;

use super::{BmcSpec, Disk, DiskType, Interface, MacAddr, MachineSpec, ValidationErrors};

/// One parsed row of an import file.
#[derive(Debug, Clone)]
pub struct ParsedRow {
    /// 1-based line of the file where the row starts.
    pub line: usize,
    /// The spec, or why the row could not be read.
    pub spec: Result<MachineSpec, ValidationErrors>,
    /// The file's format, which decides how fields are named back to the operator.
    pub format: ImportFormat,
}

impl ParsedRow {
    /// The name the operator knows a spec field by: the CSV column, or the JSON path.
    pub fn field_name(&self, path: &str) -> String {
        match self.format {
            ImportFormat::Csv => csv_column_of(path),
            ImportFormat::Json => path.to_string(),
        }
    }
}

/// A problem with one row (or the file as a whole, line 0 meaning the file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RowError {
    /// 1-based line of the file.
    pub line: usize,
    /// Field (CSV column or JSON path).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// Import file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportFormat {
    /// Comma-separated values with a header row.
    Csv,
    /// A JSON array of machine specs.
    Json,
}

/// The CSV columns, in the order the documentation lists them.
pub const CSV_COLUMNS: &[&str] = &[
    "hostname",
    "smbios_uuid",
    "serial",
    "asset_tag",
    "manufacturer",
    "model",
    "site",
    "rack",
    "rack_unit",
    "role",
    "cluster",
    "profile",
    "mac",
    "ipv4",
    "extra_macs",
    "bmc_url",
    "bmc_username",
    "bmc_password",
    "bmc_tls",
    "bmc_fingerprint",
];

/// How many disks a CSV row can carry: columns `disk1_*` to `disk8_*`.
pub const CSV_MAX_DISKS: usize = 8;

/// The fields of each disk's columns: `disk1_serial`, `disk1_wwid`, ... (`disk1_data` marks a
/// data disk: `true`/`false`, `yes`/`no`, empty meaning no).
pub const CSV_DISK_FIELDS: &[&str] = &["serial", "wwid", "model", "size_bytes", "type", "data"];

/// A header the CSV format knows: a fixed column or `diskN_FIELD` with N in 1..=8.
fn known_column(h: &str) -> bool {
    if CSV_COLUMNS.contains(&h) {
        return true;
    }
    disk_column(h).is_some()
}

/// `diskN_FIELD` as (N - 1, FIELD).
fn disk_column(h: &str) -> Option<(usize, &str)> {
    let rest = h.strip_prefix("disk")?;
    let (n, field) = rest.split_once('_')?;
    let n: usize = n.parse().ok()?;
    ((1..=CSV_MAX_DISKS).contains(&n) && CSV_DISK_FIELDS.contains(&field)).then_some((n - 1, field))
}

/// How `import --update` matches a row to the machine it replaces: the row's boot NIC (its
/// first interface) by MAC, its serial, or its host name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportKey {
    /// The boot NIC's MAC (the CSV `mac` column, a JSON row's first interface).
    Mac,
    /// The serial number.
    Serial,
    /// The host name.
    Hostname,
}

impl ImportKey {
    /// The row's value for this key, or `None` when the row has none.
    pub fn of(&self, spec: &MachineSpec) -> Option<super::UniqueKey> {
        use super::UniqueKey;
        match self {
            ImportKey::Mac => spec
                .interfaces
                .iter()
                .find(|i| i.boot)
                .or(spec.interfaces.first())
                .map(|i| UniqueKey::Mac(i.mac)),
            ImportKey::Serial => spec.serial.clone().map(UniqueKey::Serial),
            ImportKey::Hostname => spec.hostname.clone().map(UniqueKey::Hostname),
        }
    }

    /// The field a row must fill for this key (spec path).
    pub fn field(&self) -> &'static str {
        match self {
            ImportKey::Mac => "interfaces[0].mac",
            ImportKey::Serial => "serial",
            ImportKey::Hostname => "hostname",
        }
    }
}

impl std::str::FromStr for ImportKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mac" => Ok(ImportKey::Mac),
            "serial" => Ok(ImportKey::Serial),
            "hostname" => Ok(ImportKey::Hostname),
            other => Err(format!("`{other}` is not mac, serial or hostname")),
        }
    }
}

/// Parse a whole file into rows. A file-level problem (not CSV, unknown column, not a JSON array)
/// is a single `RowError` with line 0 or the line where parsing stopped. Holds every row: for
/// files of any size, walk them with [`for_each_row`].
pub fn parse(format: ImportFormat, text: &str) -> Result<Vec<ParsedRow>, RowError> {
    let mut rows = Vec::new();
    for_each_row(format, text, &mut |row| rows.push(row))?;
    Ok(rows)
}

/// Walk a file row by row in file order: `each` gets every row (with its line) as it is read, so
/// a file's rows are never all in memory at once, and the walk is linear in the file's length
/// (line numbers are counted incrementally). A file-level problem (not CSV, unknown column, not a
/// JSON array, malformed CSV or JSON part-way) is a single `RowError` with line 0 or the line where
/// reading stopped; the rows before it were given to `each` already.
pub fn for_each_row(
    format: ImportFormat,
    text: &str,
    each: &mut dyn FnMut(ParsedRow),
) -> Result<(), RowError> {
    match format {
        ImportFormat::Csv => csv_rows(text, each),
        ImportFormat::Json => json_rows(text, each),
    }
}

/// The elements of a JSON array, each deserialized as it is reached (serde's sequence visitor)
/// from the borrowed text of the element, whose position gives its line.
struct JsonRows<'t, 'f> {
    text: &'t str,
    lines: LineCounter<'t>,
    each: &'f mut dyn FnMut(ParsedRow),
}

impl<'de, 'f> serde::de::Visitor<'de> for JsonRows<'de, 'f> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array of machines")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let base = self.text.as_ptr() as usize;
        while let Some(raw) = seq.next_element::<&'de serde_json::value::RawValue>()? {
            let offset = (raw.get().as_ptr() as usize)
                .saturating_sub(base)
                .min(self.text.len());
            let line = self.lines.line_of(offset as u64);
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let spec = serde_path_to_error::deserialize::<_, MachineSpec>(&mut de).map_err(|e| {
                let mut v = ValidationErrors::default();
                v.push(json_path(e.path()), e.inner().to_string());
                v
            });
            (self.each)(ParsedRow {
                line,
                spec,
                format: ImportFormat::Json,
            });
        }
        Ok(())
    }
}

fn json_rows(text: &str, each: &mut dyn FnMut(ParsedRow)) -> Result<(), RowError> {
    use serde::Deserializer as _;
    let refused = |e: serde_json::Error| RowError {
        line: e.line(),
        field: "-".into(),
        message: format!("not a JSON array of machines: {e}"),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    (&mut de)
        .deserialize_seq(JsonRows {
            text,
            lines: LineCounter::new(text),
            each,
        })
        .map_err(refused)?;
    de.end().map_err(refused)
}

/// A serde path as the API spells field paths (`interfaces[0].mac`).
pub fn json_path(p: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for seg in p.iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            serde_path_to_error::Segment::Map { key }
            | serde_path_to_error::Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            serde_path_to_error::Segment::Unknown => {}
        }
    }
    if out.is_empty() {
        "-".into()
    } else {
        out
    }
}

fn csv_rows(text: &str, each: &mut dyn FnMut(ParsedRow)) -> Result<(), RowError> {
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .flexible(false)
        .from_reader(text.as_bytes());
    let headers = rdr
        .headers()
        .map_err(|e| RowError {
            line: 1,
            field: "-".into(),
            message: format!("cannot read the header row: {e}"),
        })?
        .clone();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (i, h) in headers.iter().enumerate() {
        let h = h.trim();
        if !known_column(h) {
            return Err(RowError {
                line: 1,
                field: h.to_string(),
                message: format!(
                    "unknown column; known columns are: {}, and per disk (N = 1..{CSV_MAX_DISKS}) diskN_{}",
                    CSV_COLUMNS.join(", "),
                    CSV_DISK_FIELDS.join(", diskN_")
                ),
            });
        }
        if index.insert(h.to_string(), i).is_some() {
            return Err(RowError {
                line: 1,
                field: h.to_string(),
                message: "column appears twice".into(),
            });
        }
    }
    let mut lines = LineCounter::new(text);
    for rec in rdr.records() {
        let rec = rec.map_err(|e| RowError {
            line: e
                .position()
                .map_or(0, |p| LineCounter::new(text).line_of(p.byte())),
            field: "-".into(),
            message: format!("malformed CSV: {e}"),
        })?;
        // From the byte offset: the csv crate's own line count skips blank lines.
        let line = rec.position().map_or(0, |p| lines.line_of(p.byte()));
        if rec.iter().all(str::is_empty) {
            continue;
        }
        let get = |col: &str| -> Option<String> {
            index
                .get(col)
                .and_then(|i| rec.get(*i))
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        each(ParsedRow {
            line,
            spec: csv_row(&get),
            format: ImportFormat::Csv,
        });
    }
    Ok(())
}

/// Line numbers of byte offsets, counted incrementally (offsets only grow while reading a file).
struct LineCounter<'a> {
    bytes: &'a [u8],
    pos: usize,
    line: usize,
}

impl<'a> LineCounter<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            bytes: text.as_bytes(),
            pos: 0,
            line: 1,
        }
    }

    /// 1-based line of the record starting at `byte` (blank lines before it are skipped, as the
    /// csv reader skips them).
    fn line_of(&mut self, byte: u64) -> usize {
        let mut end = usize::try_from(byte)
            .unwrap_or(usize::MAX)
            .min(self.bytes.len());
        while end < self.bytes.len() && matches!(self.bytes[end], b'\n' | b'\r') {
            end += 1;
        }
        if end < self.pos {
            self.pos = 0;
            self.line = 1;
        }
        self.line += self.bytes[self.pos..end]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        self.pos = end;
        self.line
    }
}

fn csv_row(get: &dyn Fn(&str) -> Option<String>) -> Result<MachineSpec, ValidationErrors> {
    let mut errs = ValidationErrors::default();
    fn parsed<T: std::str::FromStr>(
        errs: &mut ValidationErrors,
        col: &str,
        v: Option<String>,
    ) -> Option<T>
    where
        T::Err: std::fmt::Display,
    {
        v.and_then(|s| match s.parse::<T>() {
            Ok(t) => Some(t),
            Err(e) => {
                errs.push(col, format!("`{s}`: {e}"));
                None
            }
        })
    }
    let mut spec = MachineSpec {
        hostname: get("hostname"),
        smbios_uuid: parsed(&mut errs, "smbios_uuid", get("smbios_uuid")),
        serial: get("serial"),
        asset_tag: get("asset_tag"),
        manufacturer: get("manufacturer"),
        model: get("model"),
        site: get("site"),
        rack: get("rack"),
        rack_unit: parsed(&mut errs, "rack_unit", get("rack_unit")),
        role: parsed(&mut errs, "role", get("role")),
        cluster: get("cluster"),
        profile: get("profile"),
        ..Default::default()
    };
    let mac: Option<MacAddr> = parsed(&mut errs, "mac", get("mac"));
    let ipv4 = parsed(&mut errs, "ipv4", get("ipv4"));
    if let Some(mac) = mac {
        spec.interfaces.push(Interface {
            mac,
            ipv4,
            boot: true,
            name: None,
        });
    } else if ipv4.is_some() && get("mac").is_none() {
        errs.push(
            "ipv4",
            "a reserved address needs the `mac` of its interface",
        );
    }
    for m in get("extra_macs")
        .unwrap_or_default()
        .split([';', ' '])
        .filter(|s| !s.is_empty())
    {
        if let Some(mac) = parsed(&mut errs, "extra_macs", Some(m.to_string())) {
            spec.interfaces.push(Interface {
                mac,
                ipv4: None,
                boot: false,
                name: None,
            });
        }
    }
    spec.disks = csv_disks(&mut errs, get);
    match (get("bmc_url"), get("bmc_username")) {
        (Some(url), Some(username)) => {
            spec.bmc = Some(BmcSpec {
                url,
                username,
                password: get("bmc_password"),
                tls: parsed(&mut errs, "bmc_tls", get("bmc_tls")).unwrap_or(super::TlsMode::Verify),
                fingerprint: get("bmc_fingerprint"),
            })
        }
        (None, None) => {
            for col in ["bmc_password", "bmc_tls", "bmc_fingerprint"] {
                if get(col).is_some() {
                    errs.push(col, "needs bmc_url and bmc_username");
                }
            }
        }
        (Some(_), None) => errs.push("bmc_username", "required with bmc_url"),
        (None, Some(_)) => errs.push("bmc_url", "required with bmc_username"),
    }
    // CSV column names are the field names the operator sees; map spec paths back to columns.
    let mut all = errs;
    match spec.validate() {
        Ok(spec) if all.0.is_empty() => return Ok(spec),
        Ok(_) => {}
        Err(e) => all.0.extend(e.0.into_iter().map(|mut fe| {
            fe.field = csv_column_of(&fe.field);
            fe
        })),
    }
    Err(all)
}

/// The disks of a row, in column order (`disk1_*` first); a disk is there when any of its columns
/// is filled.
fn csv_disks(errs: &mut ValidationErrors, get: &dyn Fn(&str) -> Option<String>) -> Vec<Disk> {
    let mut disks = Vec::new();
    for n in 1..=CSV_MAX_DISKS {
        let col = |f: &str| format!("disk{n}_{f}");
        if CSV_DISK_FIELDS.iter().all(|f| get(&col(f)).is_none()) {
            continue;
        }
        let size_bytes = get(&col("size_bytes")).and_then(|s| match s.parse::<u64>() {
            Ok(v) => Some(v),
            Err(_) => {
                errs.push(col("size_bytes"), format!("`{s}`: a whole number of bytes"));
                None
            }
        });
        let disk_type = get(&col("type")).and_then(|s| match s.parse::<DiskType>() {
            Ok(t) => Some(t),
            Err(e) => {
                errs.push(col("type"), e);
                None
            }
        });
        let data_disk = match get(&col("data")).map(|s| s.to_ascii_lowercase()) {
            None => false,
            Some(v) if ["true", "yes", "1"].contains(&v.as_str()) => true,
            Some(v) if ["false", "no", "0"].contains(&v.as_str()) => false,
            Some(v) => {
                errs.push(col("data"), format!("`{v}`: true or false"));
                false
            }
        };
        disks.push(Disk {
            serial: get(&col("serial")),
            wwid: get(&col("wwid")),
            model: get(&col("model")),
            size_bytes,
            disk_type,
            bus_path: None,
            data_disk,
        });
    }
    disks
}

fn csv_column_of(path: &str) -> String {
    if let Some(rest) = path.strip_prefix("disks[") {
        // disks[0].size_bytes -> disk1_size_bytes (the disks of a row are numbered from 1)
        if let Some((i, field)) = rest.split_once("].") {
            if let Ok(i) = i.parse::<usize>() {
                let field = if field == "data_disk" { "data" } else { field };
                return format!("disk{}_{field}", i + 1);
            }
        }
    }
    match path {
        "interfaces[0].mac" => "mac".into(),
        "interfaces[0].ipv4" => "ipv4".into(),
        p if p.starts_with("interfaces[") => "extra_macs".into(),
        p if p.starts_with("bmc.") => p.replacen("bmc.", "bmc_", 1),
        p => p.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_rows_keep_line_numbers_and_name_columns() {
        let text = "hostname,mac,ipv4,role,rack_unit\n\
                    n1,52:54:00:00:00:01,10.0.0.1,worker,3\n\
                    n2,not-a-mac,10.0.0.2,worker,4\n\
                    \n\
                    n_3,52:54:00:00:00:03,,boss,x\n";
        let rows = parse(ImportFormat::Csv, text).expect("parses");
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].line, 2);
        assert!(rows[0].spec.is_ok());
        assert_eq!(rows[1].line, 3);
        let e = rows[1].spec.as_ref().expect_err("bad mac");
        assert_eq!(e.0[0].field, "mac");
        assert_eq!(rows[2].line, 5);
        let fields: Vec<_> = rows[2]
            .spec
            .as_ref()
            .expect_err("bad")
            .0
            .iter()
            .map(|f| f.field.clone())
            .collect();
        assert_eq!(fields, ["rack_unit", "role", "hostname"]);
    }

    #[test]
    fn csv_rows_carry_disks() {
        let text = "hostname,mac,disk1_serial,disk1_model,disk1_size_bytes,disk1_type,disk2_wwid,disk2_size_bytes,disk2_type,disk2_data\n\
                    n1,52:54:00:00:00:01,S6EX1,SAMSUNG MZQL2480HCJR,480103981056,nvme,eui.0025388,3840755982336,nvme,yes\n\
                    n2,52:54:00:00:00:02,,,,,,,,\n\
                    n3,52:54:00:00:00:03,S3,,480GB,tape,,,,maybe\n";
        let rows = parse(ImportFormat::Csv, text).expect("parses");
        let spec = rows[0].spec.as_ref().expect("row 1");
        assert_eq!(spec.disks.len(), 2);
        assert_eq!(spec.disks[0].serial.as_deref(), Some("S6EX1"));
        assert_eq!(spec.disks[0].size_bytes, Some(480_103_981_056));
        assert_eq!(spec.disks[0].disk_type, Some(DiskType::Nvme));
        assert!(!spec.disks[0].data_disk);
        assert_eq!(spec.disks[1].wwid.as_deref(), Some("eui.0025388"));
        assert!(spec.disks[1].data_disk);
        assert!(rows[1].spec.as_ref().expect("row 2").disks.is_empty());
        let fields: Vec<_> = rows[2]
            .spec
            .as_ref()
            .expect_err("bad disk")
            .0
            .iter()
            .map(|f| f.field.clone())
            .collect();
        assert_eq!(fields, ["disk1_size_bytes", "disk1_type", "disk2_data"]);
        assert_eq!(csv_column_of("disks[1].serial"), "disk2_serial");
        assert!(parse(ImportFormat::Csv, "hostname,disk9_serial\nn,x\n").is_err());
        assert!(parse(ImportFormat::Csv, "hostname,disk1_colour\nn,x\n").is_err());
    }

    #[test]
    fn csv_unknown_column_is_refused() {
        let e = parse(ImportFormat::Csv, "hostname,macc\nn1,x\n").expect_err("unknown column");
        assert_eq!(e.field, "macc");
    }

    #[test]
    fn json_rows_have_lines_and_paths() {
        let text = "[\n {\"hostname\": \"a\"},\n {\"hostname\": \"b\",\n  \"interfaces\": [{\"mac\": \"zz\"}]}\n]";
        let rows = parse(ImportFormat::Json, text).expect("parses");
        assert_eq!(rows[0].line, 2);
        assert_eq!(rows[1].line, 3);
        let e = rows[1].spec.as_ref().expect_err("bad mac");
        assert_eq!(e.0[0].field, "interfaces[0].mac");
        assert!(parse(ImportFormat::Json, "{\"a\":1}").is_err());
    }
}
