//! The workload under alloctrace's TracingAlloc, full call stacks, the
//! trace written to $ALLOCTRACE_BENCH_TRACE (default bench-rust.trace).
#[path = "../workload.rs"]
mod workload;

#[global_allocator]
static ALLOC: alloctrace::TracingAlloc<std::alloc::System> =
    alloctrace::TracingAlloc::new(std::alloc::System);

fn main() {
    let path = std::env::var("ALLOCTRACE_BENCH_TRACE").unwrap_or_else(|_| "bench-rust.trace".into());
    let guard = alloctrace::Tracer::new().path(path).start().expect("start tracing");
    workload::main_with("alloctrace", || Some(alloctrace::HeapStats::now().total_allocations));
    guard.stop().expect("stop tracing");
}
