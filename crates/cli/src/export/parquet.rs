//! `export --format parquet`: the traces as tables (docs/EXPORT.md).
//!
//! `allocations.parquet` is written while the pass runs: a row per
//! allocation lifetime, made when the allocation ends (its free, or the
//! end of its trace for what was never freed). The pass hands lifetimes in
//! batches to a [`Worker`] thread, which gathers them into columns and
//! writes a row group every [`ROW_GROUP_ROWS`] rows: the Parquet encoding
//! costs about as much as the pass, and the two run side by side. Memory
//! stays bounded whatever the trace's length (one row group of columns and
//! a few batches). The other tables (stacks, frames, modules, types,
//! traces) are small and written after the pass.
//!
//! The low-level column writer of the `parquet` crate writes them (no
//! Arrow): every column is a plain Parquet type (INT64, INT32, BOOLEAN,
//! BYTE_ARRAY with the STRING annotation), signed, so that Spark and Trino
//! read the files as they are; the plain columns' pages are
//! zstd-compressed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use alloctrace_analysis::GenerationView;
use alloctrace_analysis::{Alloc, Frame, Free, Live, Memory, Resolver, StackTable, Visitor};
use alloctrace_format::ENTRY_POINTS;
use bytes::Bytes;
use parquet::basic::{Compression, Encoding, Type as PhysicalType, ZstdLevel};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::ColumnPath;
use rustc_hash::FxHashMap;

use crate::failure::Failure;

/// Every file the export writes in its directory (`export` refuses a
/// directory where one of them is an input).
pub const TABLES: [&str; 6] = [
    "allocations.parquet",
    "stacks.parquet",
    "frames.parquet",
    "modules.parquet",
    "types.parquet",
    "traces.parquet",
];

/// Rows of `allocations.parquet` per row group: about 45 MiB of column
/// buffers (13 columns, 90 bytes a row), a few MiB once encoded. (Small in
/// unit tests, to cross row groups and chunks quickly.)
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
  REQUIRED INT64 sample_bytes;
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
}

struct Column {
    values: Values,
    defs: Option<Vec<i16>>,
}

/// Rows buffered column by column, until written out as a row group.
struct Rows {
    columns: Vec<Column>,
    rows: usize,
}

type FileWriter = SerializedFileWriter<BufWriter<File>>;

/// A Parquet file being written: buffered columns, written out as a row
/// group by [`Table::flush`].
struct Table {
    path: PathBuf,
    writer: FileWriter,
    buf: Rows,
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
            buf: Rows { columns, rows: 0 },
        })
    }

    fn column(&mut self, i: usize, present: bool) -> &mut Values {
        let column = &mut self.buf.columns[i];
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
        self.buf.rows += 1;
    }

    fn rows(&self) -> usize {
        self.buf.rows
    }

    /// Writes the buffered rows as one row group.
    fn flush(&mut self) -> Result<(), ParquetError> {
        if self.buf.rows > 0 {
            write_group(&mut self.writer, &self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    fn close(mut self) -> Result<(), Failure> {
        let path = self.path.clone();
        self.flush().map_err(|e| parquet_error(&path, e))?;
        self.writer.close().map_err(|e| parquet_error(&path, e))?;
        Ok(())
    }
}

impl Rows {
    fn clear(&mut self) {
        for column in &mut self.columns {
            match &mut column.values {
                Values::I64(v) => v.clear(),
                Values::I32(v) => v.clear(),
                Values::Bool(v) => v.clear(),
                Values::Str(v) => v.clear(),
            }
            if let Some(defs) = &mut column.defs {
                defs.clear();
            }
        }
        self.rows = 0;
    }
}

/// Writes `rows` as one row group.
fn write_group(writer: &mut FileWriter, rows: &Rows) -> Result<(), ParquetError> {
    let mut group = writer.next_row_group()?;
    for column in &rows.columns {
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
        }
        writer.close()?;
    }
    group.close()?;
    Ok(())
}

/// zstd at level 1.
fn zstd() -> Compression {
    Compression::ZSTD(ZstdLevel::try_new(1).expect("1 is a valid zstd level"))
}

/// Writer properties shared by the tables: zstd level 1, version 1 data
/// pages (what every reader takes).
fn properties() -> parquet::file::properties::WriterPropertiesBuilder {
    WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_1_0)
        .set_compression(zstd())
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
    /// A sampled trace's mean (0: every allocation recorded): each heap
    /// row then stands for 1 / (1 - exp(-size / sample_bytes)) of them.
    sample_bytes: u64,
}

/// One allocation lifetime, as the pass hands it over: a row of
/// allocations.parquet.
#[derive(Clone, Copy)]
struct Lifetime {
    alloc: Alloc,
    /// The free's time and thread, if it was freed.
    free: Option<(u64, u64)>,
    pid: i64,
    trace: i32,
}

/// Lifetimes handed to the writer thread at a time.
const BATCH: usize = if cfg!(test) { 300 } else { 1 << 14 };
/// Batches in existence at most (filled, queued, being written).
const BATCHES: usize = 4;

/// The thread that turns lifetimes into rows and writes
/// allocations.parquet, so that the pass and the Parquet encoding (which
/// costs about as much) run side by side. Batches of lifetimes go to it
/// and come back emptied for reuse: at most [`BATCHES`] of them exist,
/// plus the thread's one row group of columns.
struct Worker {
    full: mpsc::SyncSender<Vec<Lifetime>>,
    empty: mpsc::Receiver<Vec<Lifetime>>,
    made: usize,
    thread: Option<std::thread::JoinHandle<Result<(), Failure>>>,
}

impl Worker {
    fn start(table: Table) -> Worker {
        let (full, full_rx) = mpsc::sync_channel::<Vec<Lifetime>>(BATCHES - 2);
        let (empty_tx, empty) = mpsc::channel::<Vec<Lifetime>>();
        let thread = std::thread::Builder::new()
            .name("alloctrace-parquet".into())
            .spawn(move || {
                let Table {
                    path, mut writer, ..
                } = table;
                let fail = |e| parquet_error(&path, e);
                let mut group = AllocColumns::default();
                for mut batch in full_rx {
                    let mut rest = &batch[..];
                    while !rest.is_empty() {
                        let n = rest.len().min(ROW_GROUP_ROWS - group.rows);
                        group.append(&rest[..n]);
                        rest = &rest[n..];
                        if group.rows == ROW_GROUP_ROWS {
                            group.write(&mut writer).map_err(fail)?;
                            group.clear();
                        }
                    }
                    batch.clear();
                    // After an error the pass no longer takes them back.
                    let _ = empty_tx.send(batch);
                }
                if group.rows > 0 {
                    group.write(&mut writer).map_err(fail)?;
                }
                writer.close().map_err(fail)?;
                Ok(())
            })
            .expect("spawn the Parquet writer thread");
        Worker {
            full,
            empty,
            made: 1,
            thread: Some(thread),
        }
    }

    /// Hands `batch` over and puts an empty one in its place; `Err` when
    /// the thread stopped (its error comes from [`Worker::finish`]).
    fn send(&mut self, batch: &mut Vec<Lifetime>) -> Result<(), ()> {
        let fresh = if self.made < BATCHES {
            self.made += 1;
            Vec::with_capacity(BATCH)
        } else {
            self.empty.recv().map_err(|_| ())?
        };
        let full = std::mem::replace(batch, fresh);
        self.full.send(full).map_err(|_| ())
    }

    /// Waits for the thread to write everything and close the file.
    fn finish(mut self) -> Result<(), Failure> {
        let thread = self.thread.take();
        drop(self.full);
        match thread.map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result,
            _ => Err(Failure::Io(
                "the Parquet writer thread panicked".to_string(),
            )),
        }
    }
}

/// allocations.parquet's columns of one row group, filled a batch of
/// lifetimes at a time, one column after the other (tight loops over a
/// batch that is still in cache), and written out column by column.
#[derive(Default)]
struct AllocColumns {
    alloc_time: Vec<i64>,
    free_time: Vec<i64>,
    size: Vec<i64>,
    address: Vec<i64>,
    thread: Vec<i64>,
    stack: Vec<i64>,
    type_id: Vec<i64>,
    /// `Memory as u8`.
    memory: Vec<u8>,
    /// `EntryPoint as u8` (its tag, from 1).
    entry: Vec<u8>,
    process: Vec<i64>,
    trace: Vec<i32>,
    free_thread: Vec<i64>,
    existed: Vec<bool>,
    /// Definition levels of the optional columns: freed (free_time_ns,
    /// free_thread), stack_id, type_id, entry_point.
    freed: Vec<i16>,
    has_stack: Vec<i16>,
    has_type: Vec<i16>,
    has_entry: Vec<i16>,
    rows: usize,
}

impl AllocColumns {
    fn append(&mut self, batch: &[Lifetime]) {
        let b = batch;
        self.alloc_time
            .extend(b.iter().map(|l| l.alloc.time_ns as i64));
        self.size.extend(b.iter().map(|l| l.alloc.size as i64));
        self.address.extend(b.iter().map(|l| l.alloc.addr as i64));
        self.thread.extend(b.iter().map(|l| l.alloc.thread as i64));
        self.memory.extend(b.iter().map(|l| l.alloc.memory as u8));
        self.process.extend(b.iter().map(|l| l.pid));
        self.trace.extend(b.iter().map(|l| l.trace));
        self.existed.extend(b.iter().map(|l| l.alloc.existed));
        self.freed
            .extend(b.iter().map(|l| i16::from(l.free.is_some())));
        self.free_time
            .extend(b.iter().filter_map(|l| l.free.map(|(t, _)| t as i64)));
        self.free_thread
            .extend(b.iter().filter_map(|l| l.free.map(|(_, t)| t as i64)));
        self.has_stack
            .extend(b.iter().map(|l| i16::from(l.alloc.stack != 0)));
        self.stack.extend(
            b.iter()
                .filter(|l| l.alloc.stack != 0)
                .map(|l| i64::from(l.alloc.stack)),
        );
        self.has_type
            .extend(b.iter().map(|l| i16::from(l.alloc.type_id != 0)));
        self.type_id.extend(
            b.iter()
                .filter(|l| l.alloc.type_id != 0)
                .map(|l| l.alloc.type_id as i64),
        );
        self.has_entry
            .extend(b.iter().map(|l| i16::from(l.alloc.entry.is_some())));
        self.entry
            .extend(b.iter().filter_map(|l| l.alloc.entry.map(|e| e as u8)));
        self.rows += b.len();
    }

    /// Empties the columns, keeping their capacity (the next row group is
    /// as large).
    fn clear(&mut self) {
        for v in [
            &mut self.alloc_time,
            &mut self.free_time,
            &mut self.size,
            &mut self.address,
            &mut self.thread,
            &mut self.stack,
            &mut self.type_id,
            &mut self.process,
            &mut self.free_thread,
        ] {
            v.clear();
        }
        for v in [
            &mut self.freed,
            &mut self.has_stack,
            &mut self.has_type,
            &mut self.has_entry,
        ] {
            v.clear();
        }
        self.memory.clear();
        self.entry.clear();
        self.trace.clear();
        self.existed.clear();
        self.rows = 0;
    }

    /// Writes the rows as one row group.
    fn write(&self, writer: &mut FileWriter) -> Result<(), ParquetError> {
        let memory_names: Vec<ByteArray> = Memory::ALL
            .iter()
            .map(|m| static_string(m.name()))
            .collect();
        // By tag: index 0 is unused.
        let mut entry_names = vec![ByteArray::new()];
        entry_names.extend(ENTRY_POINTS.iter().map(|e| static_string(e.name())));
        let mut group = writer.next_row_group()?;
        let mut index = 0;
        while let Some(mut column) = group.next_column()? {
            let i64s = |c: &mut parquet::file::writer::SerializedColumnWriter<'_>,
                        v: &[i64],
                        defs: Option<&[i16]>| {
                c.typed::<Int64Type>()
                    .write_batch(v, defs, None)
                    .map(|_| ())
            };
            match index {
                A_ALLOC_TIME => i64s(&mut column, &self.alloc_time, None)?,
                A_FREE_TIME => i64s(&mut column, &self.free_time, Some(&self.freed))?,
                A_SIZE => i64s(&mut column, &self.size, None)?,
                A_ADDRESS => i64s(&mut column, &self.address, None)?,
                A_THREAD => i64s(&mut column, &self.thread, None)?,
                A_STACK => i64s(&mut column, &self.stack, Some(&self.has_stack))?,
                A_TYPE => i64s(&mut column, &self.type_id, Some(&self.has_type))?,
                A_MEMORY => write_names(&mut column, &self.memory, &memory_names, None)?,
                A_ENTRY => write_names(
                    &mut column,
                    &self.entry,
                    &entry_names,
                    Some(&self.has_entry),
                )?,
                A_PROCESS => i64s(&mut column, &self.process, None)?,
                A_TRACE => {
                    column
                        .typed::<Int32Type>()
                        .write_batch(&self.trace, None, None)?;
                }
                A_FREE_THREAD => i64s(&mut column, &self.free_thread, Some(&self.freed))?,
                A_EXISTED => {
                    column
                        .typed::<BoolType>()
                        .write_batch(&self.existed, None, None)?;
                }
                _ => unreachable!("allocations.parquet has 13 columns"),
            }
            column.close()?;
            index += 1;
        }
        group.close()?;
        Ok(())
    }
}

/// Rows of one name handed to the column writer at a time.
const RUN: usize = 4096;

/// Writes a string column kept as indexes into `names` (a byte a row until
/// then, instead of a 32-byte `ByteArray`). Rows come in runs of the same
/// value, each written from a prepared slice of copies of its name: no
/// string is made or dropped per row. Where the runs are short (under 16
/// rows on average), a chunk's strings are cloned one by one instead.
fn write_names(
    column: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    codes: &[u8],
    names: &[ByteArray],
    defs: Option<&[i16]>,
) -> Result<(), ParquetError> {
    let writer = column.typed::<ByteArrayType>();
    let repeated: Vec<Vec<ByteArray>> = names.iter().map(|n| vec![n.clone(); RUN]).collect();
    let mut values = Vec::new();
    let rows = defs.map_or(codes.len(), <[i16]>::len);
    let mut next_code = 0;
    for start in (0..rows).step_by(CHUNK_ROWS) {
        let end = (start + CHUNK_ROWS).min(rows);
        let chunk_defs = defs.map(|d| &d[start..end]);
        let present = chunk_defs.map_or(end - start, |d| d.iter().filter(|&&l| l == 1).count());
        let chunk_codes = &codes[next_code..next_code + present];
        next_code += present;
        // A row's value: its code, or none (null).
        let mut codes_iter = chunk_codes.iter();
        let value = |row: usize, it: &mut std::slice::Iter<'_, u8>| -> Option<u8> {
            match chunk_defs {
                Some(d) if d[row] == 0 => None,
                _ => it.next().copied(),
            }
        };
        let row_values: Vec<Option<u8>> = (0..end - start)
            .map(|row| value(row, &mut codes_iter))
            .collect();
        let runs = 1 + row_values.windows(2).filter(|w| w[0] != w[1]).count();
        if runs * 16 > row_values.len() {
            values.clear();
            values.extend(chunk_codes.iter().map(|&c| names[usize::from(c)].clone()));
            writer.write_batch(&values, chunk_defs, None)?;
            continue;
        }
        let mut row = 0;
        while row < row_values.len() {
            let v = row_values[row];
            let mut len = 1;
            while row + len < row_values.len() && len < RUN && row_values[row + len] == v {
                len += 1;
            }
            let run_defs = chunk_defs.map(|d| &d[row..row + len]);
            let run_values = match v {
                Some(c) => &repeated[usize::from(c)][..len],
                None => &[][..],
            };
            writer.write_batch(run_values, run_defs, None)?;
            row += len;
        }
    }
    Ok(())
}

/// The visitor: allocation lifetimes into allocations.parquet (through
/// the [`Worker`]), and what the small tables need from the traces
/// (types, pids).
pub struct ParquetExport {
    dir: PathBuf,
    worker: Option<Worker>,
    batch: Vec<Lifetime>,
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
        // Encodings chosen for the cost of writing as much as for size
        // (zstd does most of the compressing):
        // - times are nearly sorted: deltas; the process, trace and type
        //   are constant or nearly so, and thread IDs small: deltas of a
        //   few bits, cheaper than a dictionary lookup a row;
        // - addresses are all different: plain;
        // - the two string columns have a handful of values: plain (a
        //   dictionary would hash and compare every string);
        // - sizes and stacks repeat: dictionary.
        // Min/max statistics (what lets a reader skip row groups) for the
        // times, the process and the trace only: they cost a comparison a
        // value.
        let mut props = properties()
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_statistics_enabled(EnabledStatistics::None);
        for column in [
            "alloc_time_ns",
            "free_time_ns",
            "process",
            "trace",
            "type_id",
            "thread",
            "free_thread",
        ] {
            props = props
                .set_column_dictionary_enabled(ColumnPath::from(column), false)
                .set_column_encoding(ColumnPath::from(column), Encoding::DELTA_BINARY_PACKED);
        }
        for column in ["address", "memory", "entry_point"] {
            props = props.set_column_dictionary_enabled(ColumnPath::from(column), false);
        }
        // zstd only where it pays: plain addresses and strings, and the
        // flag (a bit a row, nearly always 0). Deltas and dictionary
        // indexes are bit-packed already, and compressing them again cost
        // more than the rest of the encoding. (DELTA_BYTE_ARRAY strings
        // instead of plain and zstd cost half as much again.)
        props = props.set_compression(Compression::UNCOMPRESSED);
        for column in ["address", "memory", "entry_point", "existed"] {
            props = props.set_column_compression(ColumnPath::from(column), zstd());
        }
        for column in ["alloc_time_ns", "free_time_ns", "process", "trace"] {
            props = props
                .set_column_statistics_enabled(ColumnPath::from(column), EnabledStatistics::Chunk);
        }
        let allocations = Table::create(
            dir.join("allocations.parquet"),
            ALLOCATIONS_SCHEMA,
            props.build(),
        )?;
        Ok(ParquetExport {
            dir: dir.to_path_buf(),
            worker: Some(Worker::start(allocations)),
            batch: Vec::with_capacity(BATCH),
            names,
            traces: Vec::new(),
            trace: 0,
            pid: 0,
            types: BTreeMap::new(),
        })
    }

    #[inline]
    fn row(&mut self, alloc: &Alloc, free: Option<&Free>) {
        self.batch.push(Lifetime {
            alloc: *alloc,
            free: free.map(|f| (f.time_ns, f.thread)),
            pid: self.pid,
            trace: self.trace,
        });
        if self.batch.len() >= BATCH {
            self.send();
        }
    }

    /// Hands the batch to the worker; after its failure, lifetimes are
    /// dropped (`finish` reports the error).
    fn send(&mut self) {
        if let Some(worker) = &mut self.worker {
            if worker.send(&mut self.batch).is_err() {
                self.batch.clear();
            }
        } else {
            self.batch.clear();
        }
    }

    /// Writes the last row group and the small tables.
    pub fn finish(mut self, stacks: &StackTable, resolver: &mut Resolver) -> Result<(), Failure> {
        if !self.batch.is_empty() {
            self.send();
        }
        if let Some(worker) = self.worker.take() {
            worker.finish()?;
        }
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
            t.i64(4, trace.sample_bytes as i64);
            t.end_row();
        }
        t.close()
    }
}

impl ParquetExport {
    /// The largest sampling mean of the traces read (0: none sampled):
    /// then traces.parquet's `sample_bytes` says how to weigh the rows.
    pub fn sampling(&self) -> alloctrace_analysis::Sampling {
        let mut sampling = alloctrace_analysis::Sampling::default();
        for t in &self.traces {
            sampling.note(t.sample_bytes);
        }
        sampling
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
            sample_bytes: 0,
        });
    }

    fn generation(&mut self, reader: &GenerationView, _stacks: &StackTable) {
        if let Some(info) = reader.info() {
            self.pid = info.pid as i64;
            if let Some(row) = self.traces.last_mut() {
                row.pid = info.pid;
                // Event times count from the first generation's start.
                if row.start_unix_ns.is_none() {
                    row.start_unix_ns = Some(info.start_wall_ns);
                }
                row.sample_bytes = row.sample_bytes.max(info.sample_bytes);
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
        if t.rows() >= ROW_GROUP_ROWS {
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
        if t.rows() >= ROW_GROUP_ROWS {
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
    use alloctrace_format::EntryPoint;

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
        // Runs of one row (strings cloned one by one) in the first half,
        // long runs, nulls among them, in the second.
        let entry_of = |i: u64| {
            if i < n as u64 / 2 {
                i % 3
            } else {
                (i / 50) % 3
            }
        };
        for i in 0..n as u64 {
            let alloc = Alloc {
                time_ns: i,
                thread: i % 7,
                addr: 0x1000 + 16 * i,
                size: i % 100,
                type_id: 0,
                stack: (i % 11) as u32,
                memory: if (i / 100).is_multiple_of(4) {
                    Memory::Span
                } else {
                    Memory::Heap
                },
                entry: match entry_of(i) {
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

        let mut written: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        written.sort();
        let mut tables = TABLES.map(String::from).to_vec();
        tables.sort();
        assert_eq!(written, tables, "the files TABLES lists, and no other");

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
            let memory = if (i / 100).is_multiple_of(4) {
                "span"
            } else {
                "heap"
            };
            assert_eq!(row.get_string(A_MEMORY).unwrap(), memory, "row {i}");
            let entry = match entry_of(i) {
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
