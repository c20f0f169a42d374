//! Call stacks: the tracer's own capture of native call stacks
//! ([`capture`], public as `alloctrace_writer::capture`), and the tables
//! that intern them: call stacks (`call_stack_table`), registered frames
//! (`frame_table`), loaded modules (`module_table`), and their listing
//! before each batch by the writer thread (`tables`). Below the session
//! layer, which sets the capture up; above the machinery the capture runs
//! on (the threads' slots, their seqlocks, the clock).

pub(crate) mod call_stack_table;
pub mod capture;
pub(crate) mod frame_table;
pub(crate) mod module_table;
pub(crate) mod tables;
