//! The workload with the system allocator alone.
#[path = "../workload.rs"]
mod workload;

fn main() {
    workload::main_with("plain", || None);
}
