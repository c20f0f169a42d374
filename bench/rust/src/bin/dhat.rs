//! The workload under dhat-rs's heap profiler (its default: a backtrace
//! per allocation), the profile written to dhat-heap.json in the working
//! directory when the profiler drops.
#[path = "../workload.rs"]
mod workload;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn main() {
    let _profiler = dhat::Profiler::new_heap();
    workload::main_with("dhat", || Some(dhat::HeapStats::get().total_blocks));
}
