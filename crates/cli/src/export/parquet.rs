//! `export --format parquet`: the traces as tables (docs/EXPORT.md).
//!
//! `allocations.parquet` is written while the pass runs: a row per
//! allocation lifetime, appended when the allocation ends (its free, or
//! the end of its trace for what was never freed), buffered in columns and
//! written out as a row group every [`ROW_GROUP_ROWS`] rows, so memory
//! stays bounded whatever the trace's length. The other tables (stacks,
//! frames, modules, types, traces) are small and written after the pass.
//!
//! The low-level column writer of the `parquet` crate writes them (no
//! Arrow): every column is a plain Parquet type (INT64, INT32, BOOLEAN,
//! BYTE_ARRAY with the STRING annotation), signed, so that Spark and Trino
//! read the files as they are; pages are zstd-compressed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use alloctrace_analysis::{Alloc, Frame, Free, Live, Memory, Resolver, StackTable, Visitor};
use alloctrace_format::{EntryPoint, ENTRY_POINTS};
use alloctrace_reader::TraceReader;
use bytes::Bytes;
use parquet::basic::{Compression, Encoding, Type as PhysicalType, ZstdLevel};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::ColumnPath;
use rustc_hash::FxHashMap;

use crate::Failure;

/// Rows of `allocations.parquet` per row group: about 45 MiB of column
/// buffers (13 columns, 90 bytes a row), a few MiB once encoded.
/// (Small in unit tests, to cross row groups and chunks quickly.)
pub const ROW_GROUP_ROWS: usize = if cfg!(test) { 2500 } else { 1 << 19 };

/// Rows of a coded string column turned into strings per call of the
/// column writer.
const CHUNK_ROWS: usize = if cfg!(test) { 1000 } else { 1 << 16 };

const ALLOCATIONS_SCHEMA: &str = "
message allocations {
  REQUIRED INT64 alloc_time_ns;
  OPTIONAL INT64 free_time_ns;
  REQUIRED INT64 size;
  REQUIRED INT64 address;
  REQUIRED INT64 thread;
  OPTIONAL INT64 stack_id;
  OPTIONAL INT64 type_id;
  REQUIRED BINARY memory (STRING);
  OPTIONAL BINARY entry_point (STRING);
  REQUIRED INT64 process;
  REQUIRED INT32 trace;
  OPTIONAL INT64 free_thread;
  REQUIRED BOOLEAN existed;
}";

const STACKS_SCHEMA: &str = "
message stacks {
  REQUIRED INT64 stack_id;
  OPTIONAL INT64 parent_id;
  REQUIRED INT64 frame_id;
  REQUIRED INT32 depth;
}";

const FRAMES_SCHEMA: &str = "
message frames {
  REQUIRED INT64 frame_id;
  REQUIRED INT32 inline_index;
  REQUIRED BOOLEAN inlined;
  REQUIRED BINARY function (STRING);
  OPTIONAL BINARY file (STRING);
  OPTIONAL INT32 line;
  REQUIRED BINARY module (STRING);
  OPTIONAL INT32 module_id;
  REQUIRED BINARY address (STRING);
  REQUIRED BINARY kind (STRING);
}";

const MODULES_SCHEMA: &str = "
message modules {
  REQUIRED INT32 module_id;
  REQUIRED BINARY path (STRING);
  REQUIRED BINARY build_id (STRING);
}";

const TYPES_SCHEMA: &str = "
message types {
  REQUIRED INT32 trace;
  REQUIRED INT64 type_id;
  REQUIRED BINARY name (STRING);
  REQUIRED INT64 size;
  REQUIRED INT64 ptr_bytes;
}";

const TRACES_SCHEMA: &str = "
message traces {
  REQUIRED INT32 trace;
  REQUIRED BINARY file (STRING);
  REQUIRED INT64 process;
  OPTIONAL INT64 start_unix_ns;
}";

fn parquet_error(path: &Path, err: ParquetError) -> Failure {
    Failure::Io(format!("cannot write {}: {err}", path.display()))
}

/// One column's buffered values; `defs` holds a definition level per row
/// (1 present, 0 null) for an optional column.
enum Values {
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
    Str(Vec<ByteArray>),
    /// A string column of few distinct values, kept as indexes into
    /// `names` (a byte a row instead of a 32-byte `ByteArray`).
    Codes {
        codes: Vec<u8>,
        names: Vec<ByteArray>,
    },
}

struct Column {
    values: Values,
    defs: Option<Vec<i16>>,
}

/// A Parquet file being written: buffered columns, written out as a row
/// group by [`Table::flush`].
struct Table {
    path: PathBuf,
    writer: SerializedFileWriter<BufWriter<File>>,
    columns: Vec<Column>,
    rows: usize,
}

impl Table {
    fn create(path: PathBuf, schema: &str, props: WriterProperties) -> Result<Table, Failure> {
        let schema = Arc::new(parse_message_type(schema).map_err(|e| parquet_error(&path, e))?);
        let file = File::create(&path)
            .map_err(|e| Failure::Io(format!("cannot create {}: {e}", path.display())))?;
        let writer = SerializedFileWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            schema,
            props.into(),
        )
        .map_err(|e| parquet_error(&path, e))?;
        let columns = writer
            .schema_descr()
            .columns()
            .iter()
            .map(|c| Column {
                values: match c.physical_type() {
                    PhysicalType::INT64 => Values::I64(Vec::new()),
                    PhysicalType::INT32 => Values::I32(Vec::new()),
                    PhysicalType::BOOLEAN => Values::Bool(Vec::new()),
                    _ => Values::Str(Vec::new()),
                },
                defs: (c.max_def_level() > 0).then(Vec::new),
            })
            .collect();
        Ok(Table {
            path,
            writer,
            columns,
            rows: 0,
        })
    }

    fn column(&mut self, i: usize, present: bool) -> &mut Values {
        let column = &mut self.columns[i];
        if let Some(defs) = &mut column.defs {
            defs.push(i16::from(present));
        }
        &mut column.values
    }

    #[inline]
    fn i64(&mut self, i: usize, v: i64) {
        match self.column(i, true) {
            Values::I64(values) => values.push(v),
            _ => unreachable!("column {i} is INT64"),
        }
    }

    #[inline]
    fn opt_i64(&mut self, i: usize, v: Option<i64>) {
        match (self.column(i, v.is_some()), v) {
            (Values::I64(values), Some(v)) => values.push(v),
            (Values::I64(_), None) => {}
            _ => unreachable!("column {i} is INT64"),
        }
    }

    #[inline]
    fn i32(&mut self, i: usize, v: i32) {
        match self.column(i, true) {
            Values::I32(values) => values.push(v),
            _ => unreachable!("column {i} is INT32"),
        }
    }

    fn opt_i32(&mut self, i: usize, v: Option<i32>) {
        match (self.column(i, v.is_some()), v) {
            (Values::I32(values), Some(v)) => values.push(v),
            (Values::I32(_), None) => {}
            _ => unreachable!("column {i} is INT32"),
        }
    }

    #[inline]
    fn bool(&mut self, i: usize, v: bool) {
        match self.column(i, true) {
            Values::Bool(values) => values.push(v),
            _ => unreachable!("column {i} is BOOLEAN"),
        }
    }

    /// Makes column `i` (a string column) a coded one with these names.
    fn use_codes(&mut self, i: usize, names: Vec<ByteArray>) {
        self.columns[i].values = Values::Codes {
            codes: Vec::new(),
            names,
        };
    }

    /// Index `code` of the column's names, or null.
    #[inline]
    fn code(&mut self, i: usize, code: Option<u8>) {
        match (self.column(i, code.is_some()), code) {
            (Values::Codes { codes, .. }, Some(c)) => codes.push(c),
            (Values::Codes { .. }, None) => {}
            _ => unreachable!("column {i} is coded"),
        }
    }

    #[inline]
    fn str(&mut self, i: usize, v: ByteArray) {
        self.opt_str(i, Some(v));
    }

    #[inline]
    fn opt_str(&mut self, i: usize, v: Option<ByteArray>) {
        match (self.column(i, v.is_some()), v) {
            (Values::Str(values), Some(v)) => values.push(v),
            (Values::Str(_), None) => {}
            _ => unreachable!("column {i} is BYTE_ARRAY"),
        }
    }

    /// A row is complete.
    #[inline]
    fn end_row(&mut self) {
        self.rows += 1;
    }

    /// Writes the buffered rows as one row group.
    fn flush(&mut self) -> Result<(), ParquetError> {
        if self.rows == 0 {
            return Ok(());
        }
        let mut group = self.writer.next_row_group()?;
        for column in &mut self.columns {
            let Some(mut writer) = group.next_column()? else {
                break;
            };
            let defs = column.defs.as_deref();
            match &column.values {
                Values::I64(v) => {
                    writer.typed::<Int64Type>().write_batch(v, defs, None)?;
                }
                Values::I32(v) => {
                    writer.typed::<Int32Type>().write_batch(v, defs, None)?;
                }
                Values::Bool(v) => {
                    writer.typed::<BoolType>().write_batch(v, defs, None)?;
                }
                Values::Str(v) => {
                    writer.typed::<ByteArrayType>().write_batch(v, defs, None)?;
                }
                Values::Codes { codes, names } => {
                    write_codes(writer.typed::<ByteArrayType>(), codes, names, defs)?;
                }
            }
            writer.close()?;
            match &mut column.values {
                Values::I64(v) => v.clear(),
                Values::I32(v) => v.clear(),
                Values::Bool(v) => v.clear(),
                Values::Str(v) => v.clear(),
                Values::Codes { codes, .. } => codes.clear(),
            }
            if let Some(defs) = &mut column.defs {
                defs.clear();
            }
        }
        group.close()?;
        self.rows = 0;
        Ok(())
    }

    fn close(mut self) -> Result<(), Failure> {
        let path = self.path.clone();
        self.flush().map_err(|e| parquet_error(&path, e))?;
        self.writer.close().map_err(|e| parquet_error(&path, e))?;
        Ok(())
    }
}

/// Writes a coded column's strings, [`CHUNK_ROWS`] rows at a time.
fn write_codes(
    writer: &mut parquet::column::writer::ColumnWriterImpl<'_, ByteArrayType>,
    codes: &[u8],
    names: &[ByteArray],
    defs: Option<&[i16]>,
) -> Result<(), ParquetError> {
    let mut values = Vec::with_capacity(CHUNK_ROWS);
    let rows = defs.map_or(codes.len(), <[i16]>::len);
    let mut next_code = 0;
    for start in (0..rows).step_by(CHUNK_ROWS) {
        let end = (start + CHUNK_ROWS).min(rows);
        let chunk_defs = defs.map(|d| &d[start..end]);
        let present = chunk_defs.map_or(end - start, |d| d.iter().filter(|&&l| l == 1).count());
        values.clear();
        values.extend(
            codes[next_code..next_code + present]
                .iter()
                .map(|&c| names[usize::from(c)].clone()),
        );
        next_code += present;
        writer.write_batch(&values, chunk_defs, None)?;
    }
    Ok(())
}

/// Writer properties shared by the tables: zstd level 1, version 1 data
/// pages (what every reader takes).
fn properties() -> parquet::file::properties::WriterPropertiesBuilder {
    WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_1_0)
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(1).expect("1 is a valid zstd level"),
        ))
        .set_created_by(format!("alloctrace {}", env!("CARGO_PKG_VERSION")))
}

fn string(s: &str) -> ByteArray {
    ByteArray::from(s)
}

fn static_string(s: &'static str) -> ByteArray {
    ByteArray::from(Bytes::from_static(s.as_bytes()))
}

// Columns of allocations.parquet, in schema order.
const A_ALLOC_TIME: usize = 0;
const A_FREE_TIME: usize = 1;
const A_SIZE: usize = 2;
const A_ADDRESS: usize = 3;
const A_THREAD: usize = 4;
const A_STACK: usize = 5;
const A_TYPE: usize = 6;
const A_MEMORY: usize = 7;
const A_ENTRY: usize = 8;
const A_PROCESS: usize = 9;
const A_TRACE: usize = 10;
const A_FREE_THREAD: usize = 11;
const A_EXISTED: usize = 12;

/// A trace of the pass, for traces.parquet.
struct TraceRow {
    file: String,
    pid: u64,
    start_unix_ns: Option<u64>,
}

/// The visitor: allocation lifetimes into allocations.parquet, and what
/// the small tables need from the traces (types, pids).
pub struct ParquetExport {
    dir: PathBuf,
    allocations: Table,
    /// The first write error; nothing more is written after it.
    error: Option<Failure>,
    names: Vec<String>,
    traces: Vec<TraceRow>,
    trace: i32,
    pid: i64,
    /// Types by (trace, type ID), the first definition of each.
    types: BTreeMap<(i32, u64), (String, u64, u64)>,
}

impl ParquetExport {
    /// Creates `dir` (if needed) and allocations.parquet in it; `names`
    /// are the traces' names, in pass order.
    pub fn create(dir: &Path, names: Vec<String>) -> Result<ParquetExport, Failure> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::Io(format!("cannot create {}: {e}", dir.display())))?;
        // High-cardinality columns skip the dictionary (it would overflow
        // and fall back anyway); times are nearly sorted, so deltas suit
        // them.
        let mut props = properties().set_max_row_group_row_count(Some(ROW_GROUP_ROWS));
        for column in ["alloc_time_ns", "free_time_ns"] {
            props = props
                .set_column_dictionary_enabled(ColumnPath::from(column), false)
                .set_column_encoding(ColumnPath::from(column), Encoding::DELTA_BINARY_PACKED);
        }
        props = props.set_column_dictionary_enabled(ColumnPath::from("address"), false);
        let mut allocations = Table::create(
            dir.join("allocations.parquet"),
            ALLOCATIONS_SCHEMA,
            props.build(),
        )?;
        // Memory kinds by `Memory as u8`; entry points by tag (0 unused).
        allocations.use_codes(
            A_MEMORY,
            Memory::ALL
                .iter()
                .map(|m| static_string(m.name()))
                .collect(),
        );
        let mut entry_names = vec![ByteArray::new()];
        entry_names.extend(ENTRY_POINTS.iter().map(|e| static_string(e.name())));
        allocations.use_codes(A_ENTRY, entry_names);
        Ok(ParquetExport {
            dir: dir.to_path_buf(),
            allocations,
            error: None,
            names,
            traces: Vec::new(),
            trace: 0,
            pid: 0,
            types: BTreeMap::new(),
        })
    }

    fn row(&mut self, alloc: &Alloc, free: Option<&Free>) {
        if self.error.is_some() {
            return;
        }
        let t = &mut self.allocations;
        t.i64(A_ALLOC_TIME, alloc.time_ns as i64);
        t.opt_i64(A_FREE_TIME, free.map(|f| f.time_ns as i64));
        t.i64(A_SIZE, alloc.size as i64);
        t.i64(A_ADDRESS, alloc.addr as i64);
        t.i64(A_THREAD, alloc.thread as i64);
        t.opt_i64(
            A_STACK,
            (alloc.stack != 0).then_some(i64::from(alloc.stack)),
        );
        t.opt_i64(A_TYPE, (alloc.type_id != 0).then_some(alloc.type_id as i64));
        t.code(A_MEMORY, Some(alloc.memory as u8));
        t.code(A_ENTRY, alloc.entry.map(|e: EntryPoint| e as u8));
        t.i64(A_PROCESS, self.pid);
        t.i32(A_TRACE, self.trace);
        t.opt_i64(A_FREE_THREAD, free.map(|f| f.thread as i64));
        t.bool(A_EXISTED, alloc.existed);
        t.end_row();
        if t.rows >= ROW_GROUP_ROWS {
            if let Err(e) = t.flush() {
                self.error = Some(parquet_error(&t.path, e));
            }
        }
    }

    /// Writes the last row group and the small tables.
    pub fn finish(self, stacks: &StackTable, resolver: &mut Resolver) -> Result<(), Failure> {
        if let Some(err) = self.error {
            return Err(err);
        }
        self.allocations.close()?;
        write_stacks(&self.dir, stacks, resolver)?;
        let mut t = Table::create(
            self.dir.join("types.parquet"),
            TYPES_SCHEMA,
            properties().build(),
        )?;
        for ((trace, id), (name, size, ptr_bytes)) in &self.types {
            t.i32(0, *trace);
            t.i64(1, *id as i64);
            t.str(2, string(name));
            t.i64(3, *size as i64);
            t.i64(4, *ptr_bytes as i64);
            t.end_row();
        }
        t.close()?;
        let mut t = Table::create(
            self.dir.join("traces.parquet"),
            TRACES_SCHEMA,
            properties().build(),
        )?;
        for (i, trace) in self.traces.iter().enumerate() {
            t.i32(0, i as i32);
            t.str(1, string(&trace.file));
            t.i64(2, trace.pid as i64);
            t.opt_i64(3, trace.start_unix_ns.map(|n| n as i64));
            t.end_row();
        }
        t.close()
    }
}

impl Visitor for ParquetExport {
    fn trace_start(&mut self, index: usize) {
        self.trace = index as i32;
        self.pid = 0;
        self.traces.push(TraceRow {
            file: self.names.get(index).cloned().unwrap_or_default(),
            pid: 0,
            start_unix_ns: None,
        });
    }

    fn generation<R: Read>(&mut self, reader: &TraceReader<R>, _stacks: &StackTable) {
        if let Some(info) = reader.info() {
            self.pid = info.pid as i64;
            if let Some(row) = self.traces.last_mut() {
                row.pid = info.pid;
                // Event times count from the first generation's start.
                if row.start_unix_ns.is_none() {
                    row.start_unix_ns = Some(info.start_wall_ns);
                }
            }
        }
        for (id, t) in reader.types() {
            self.types
                .entry((self.trace, *id))
                .or_insert_with(|| (t.name.clone(), t.size, t.ptr_bytes));
        }
    }

    #[inline]
    fn alloc(&mut self, _alloc: &Alloc) {}

    #[inline]
    fn free(&mut self, alloc: &Alloc, free: &Free) {
        self.row(alloc, Some(free));
    }

    fn trace_end(&mut self, live: &Live) {
        for alloc in live.iter() {
            self.row(alloc, None);
        }
    }
}

/// stacks.parquet, frames.parquet and modules.parquet from the pass's
/// stack table, its frames symbolized.
fn write_stacks(dir: &Path, stacks: &StackTable, resolver: &mut Resolver) -> Result<(), Failure> {
    // A frame ID per distinct frame, in order of first use.
    let mut frame_ids: FxHashMap<Frame, i64> = FxHashMap::default();
    let mut frames: Vec<Frame> = Vec::new();
    let mut depths: Vec<i32> = vec![0; stacks.len()];
    let mut t = Table::create(
        dir.join("stacks.parquet"),
        STACKS_SCHEMA,
        properties().build(),
    )?;
    for stack in 1..stacks.len() as u32 {
        let Some(frame) = stacks.frame(stack) else {
            continue;
        };
        let frame_id = *frame_ids.entry(frame).or_insert_with(|| {
            frames.push(frame);
            frames.len() as i64
        });
        let parent = stacks.parent(stack);
        // Parents precede their nodes (StackTable's invariant 1).
        let depth = depths[parent as usize] + 1;
        depths[stack as usize] = depth;
        t.i64(0, i64::from(stack));
        t.opt_i64(1, (parent != 0).then_some(i64::from(parent)));
        t.i64(2, frame_id);
        t.i32(3, depth);
        t.end_row();
        if t.rows >= ROW_GROUP_ROWS {
            t.flush().map_err(|e| parquet_error(&t.path, e))?;
        }
    }
    t.close()?;

    let mut t = Table::create(
        dir.join("frames.parquet"),
        FRAMES_SCHEMA,
        properties().build(),
    )?;
    for (i, &frame) in frames.iter().enumerate() {
        let (module_id, kind) = match frame {
            Frame::Native { module, .. } => (Some(module as i32), "native"),
            Frame::Unknown { .. } => (None, "unknown"),
            Frame::Registered(_) => (None, "registered"),
            Frame::Truncated => (None, "truncated"),
        };
        let source = resolver.frame(stacks, frame);
        let last = source.len().saturating_sub(1);
        for (j, s) in source.iter().enumerate() {
            t.i64(0, i as i64 + 1);
            t.i32(1, j as i32);
            t.bool(2, j < last);
            t.str(3, string(&s.function));
            t.opt_str(4, s.file.as_deref().map(string));
            t.opt_i32(5, s.line.map(|l| i32::try_from(l).unwrap_or(i32::MAX)));
            t.str(6, string(&s.module));
            t.opt_i32(7, module_id);
            t.str(8, string(&s.address));
            t.str(9, static_string(kind));
            t.end_row();
        }
        if t.rows >= ROW_GROUP_ROWS {
            t.flush().map_err(|e| parquet_error(&t.path, e))?;
        }
    }
    t.close()?;

    let mut t = Table::create(
        dir.join("modules.parquet"),
        MODULES_SCHEMA,
        properties().build(),
    )?;
    for (i, m) in stacks.modules().iter().enumerate() {
        t.i32(0, i as i32);
        t.str(1, string(&m.path));
        let build_id: String = m.build_id.iter().map(|b| format!("{b:02x}")).collect();
        t.str(2, string(&build_id));
        t.end_row();
    }
    t.close()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_parse() {
        for schema in [
            ALLOCATIONS_SCHEMA,
            STACKS_SCHEMA,
            FRAMES_SCHEMA,
            MODULES_SCHEMA,
            TYPES_SCHEMA,
            TRACES_SCHEMA,
        ] {
            parse_message_type(schema).expect(schema);
        }
        let schema = parse_message_type(ALLOCATIONS_SCHEMA).unwrap();
        let names: Vec<&str> = schema.get_fields().iter().map(|f| f.name()).collect();
        assert_eq!(names[A_ALLOC_TIME], "alloc_time_ns");
        assert_eq!(names[A_FREE_TIME], "free_time_ns");
        assert_eq!(names[A_SIZE], "size");
        assert_eq!(names[A_ADDRESS], "address");
        assert_eq!(names[A_THREAD], "thread");
        assert_eq!(names[A_STACK], "stack_id");
        assert_eq!(names[A_TYPE], "type_id");
        assert_eq!(names[A_MEMORY], "memory");
        assert_eq!(names[A_ENTRY], "entry_point");
        assert_eq!(names[A_PROCESS], "process");
        assert_eq!(names[A_TRACE], "trace");
        assert_eq!(names[A_FREE_THREAD], "free_thread");
        assert_eq!(names[A_EXISTED], "existed");
    }

    /// Rows across row groups and coded-column chunks, with nulls, read
    /// back with the parquet crate's own reader.
    #[test]
    fn allocations_read_back_as_written() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::record::RowAccessor;

        let dir = std::env::temp_dir().join(format!("alloctrace-parquet-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut export =
            ParquetExport::create(&dir, vec!["t".to_string()]).unwrap_or_else(|_| panic!("create"));
        export.trace_start(0);
        let n = ROW_GROUP_ROWS + 3 * CHUNK_ROWS + 17;
        for i in 0..n as u64 {
            let alloc = Alloc {
                time_ns: i,
                thread: i % 7,
                addr: 0x1000 + 16 * i,
                size: i % 100,
                type_id: 0,
                stack: (i % 11) as u32,
                memory: if i.is_multiple_of(4) {
                    Memory::Span
                } else {
                    Memory::Heap
                },
                entry: match i % 3 {
                    0 => None,
                    1 => Some(EntryPoint::Malloc),
                    _ => Some(EntryPoint::Calloc),
                },
                existed: false,
            };
            let free = Free {
                time_ns: i + 5,
                thread: 1,
                entry: None,
                implicit: false,
            };
            export.row(&alloc, (!i.is_multiple_of(5)).then_some(&free));
        }
        let mut resolver = Resolver::new(alloctrace_symbolize::Symbolizer::new(
            alloctrace_symbolize::Options::default(),
        ));
        if export.finish(&StackTable::new(), &mut resolver).is_err() {
            panic!("finish");
        }

        let file = File::open(dir.join("allocations.parquet")).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        assert!(reader.metadata().num_row_groups() >= 2);
        let mut count = 0u64;
        for (i, row) in reader.get_row_iter(None).unwrap().enumerate() {
            let row = row.unwrap();
            let i = i as u64;
            assert_eq!(row.get_long(A_ALLOC_TIME).unwrap(), i as i64);
            assert_eq!(
                row.get_long(A_FREE_TIME).ok(),
                (!i.is_multiple_of(5)).then_some(i as i64 + 5)
            );
            let memory = if i.is_multiple_of(4) { "span" } else { "heap" };
            assert_eq!(row.get_string(A_MEMORY).unwrap(), memory, "row {i}");
            let entry = match i % 3 {
                0 => None,
                1 => Some("malloc"),
                _ => Some("calloc"),
            };
            assert_eq!(
                row.get_string(A_ENTRY).ok().map(String::as_str),
                entry,
                "row {i}"
            );
            assert_eq!(
                row.get_long(A_STACK).ok(),
                (!i.is_multiple_of(11)).then_some((i % 11) as i64)
            );
            count += 1;
        }
        assert_eq!(count, n as u64);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
