//! The event layer, the top of the writer: the event calls ([`calls`],
//! public as `alloctrace_writer::events`) and the event path under them
//! (`emit`: from the check that tracing is on to the bytes in the thread's
//! batch buffer). It reads the session (session/) inside each event's
//! seqlock section; nothing below imports it.

pub mod calls;
pub(crate) mod emit;
pub(crate) mod sample;
