//! The hand-over from a reading thread to a worker thread: the reading
//! thread decodes a trace and pushes its events, in order and in chunks,
//! to a worker that consumes them in the same order. The result is that of
//! one thread doing both.
//!
//! Every chunk carries a header (what the worker needs to know of the
//! events' generation: its clock, its stacks); [`Feed::open`] starts the
//! chunks of a new header. Chunks go back to the reading thread once
//! consumed, to be filled again: a feed allocates [`Shape::chunks`]
//! chunks at most, whatever the trace's length.
//!
//! [`Pass::run`](crate::Pass::run) reads through one.

use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::{Scope, ScopedJoinHandle};

/// What the worker thread does with the chunks, in order.
pub trait Work<T, H>: Send {
    /// `items`, the next events in trace order, all under `header`.
    fn chunk(&mut self, header: &H, items: &[T]);
}

/// How many events a chunk holds and how many full chunks may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Events per chunk: each chunk costs the threads a hand-over (a
    /// wake-up of the worker, when it waits), and memory.
    pub chunk: usize,
    /// Full chunks waiting for the worker, at most. 0: a chunk is handed
    /// straight to the worker, which waits for it.
    pub queue: usize,
}

impl Shape {
    /// Chunks in all: one being filled, the waiting ones, one being
    /// consumed.
    pub fn chunks(self) -> usize {
        self.queue + 2
    }
}

struct Chunk<T, H> {
    items: Vec<T>,
    header: H,
}

/// The worker thread and the chunks on their way to it.
pub struct Feed<'scope, T, H, W> {
    chunk: Chunk<T, H>,
    shape: Shape,
    /// Chunks made so far, at most `shape.chunks()`.
    chunks: usize,
    /// The worker is gone (it panicked): chunks are emptied, not sent.
    gone: bool,
    to_worker: SyncSender<Chunk<T, H>>,
    returned: Receiver<Chunk<T, H>>,
    worker: ScopedJoinHandle<'scope, W>,
}

impl<'scope, T, H, W> Feed<'scope, T, H, W>
where
    T: Send + 'scope,
    H: Clone + Send + 'scope,
    W: Work<T, H> + 'scope,
{
    /// Starts `work` on a thread named `name` of `scope`; the first
    /// events go under `header`.
    pub fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        name: &str,
        shape: Shape,
        header: H,
        mut work: W,
    ) -> io::Result<Self> {
        let (to_worker, chunks) = mpsc::sync_channel::<Chunk<T, H>>(shape.queue);
        let (give_back, returned) = mpsc::channel::<Chunk<T, H>>();
        let worker =
            std::thread::Builder::new()
                .name(name.into())
                .spawn_scoped(scope, move || {
                    for chunk in chunks {
                        work.chunk(&chunk.header, &chunk.items);
                        // The reading thread may have stopped (an error).
                        let _ = give_back.send(chunk);
                    }
                    work
                })?;
        Ok(Feed {
            chunk: Chunk {
                items: Vec::with_capacity(shape.chunk),
                header,
            },
            shape,
            chunks: 1,
            gone: false,
            to_worker,
            returned,
            worker,
        })
    }

    #[inline(always)]
    pub fn push(&mut self, item: T) {
        self.chunk.items.push(item);
        if self.chunk.items.len() >= self.shape.chunk {
            self.send();
        }
    }

    /// The events to come go under `header`: the chunk being filled, if
    /// it holds any, is handed over first.
    pub fn open(&mut self, header: H) {
        if !self.chunk.items.is_empty() {
            self.send();
        }
        self.chunk.header = header;
    }

    /// Hands the chunk being filled over now, even empty (so that the
    /// worker sees its header).
    pub fn flush(&mut self) {
        self.send();
    }

    /// Whether the worker is gone (it panicked; [`finish`](Self::finish)
    /// says so): what is pushed is dropped.
    pub fn is_gone(&self) -> bool {
        self.gone
    }

    /// Hands the chunk over and starts another under the same header: one
    /// handed back, or a new one while fewer than `shape.chunks()` exist.
    #[inline(never)]
    fn send(&mut self) {
        let next = match self.returned.try_recv() {
            Ok(chunk) => Some(chunk),
            Err(_) if self.chunks < self.shape.chunks() => {
                self.chunks += 1;
                Some(Chunk {
                    items: Vec::with_capacity(self.shape.chunk),
                    header: self.chunk.header.clone(),
                })
            }
            // Every chunk is out: wait for one.
            Err(_) => self.returned.recv().ok(),
        };
        // None, or a failed send: the worker is gone. The chunk is
        // emptied and refilled.
        let Some(mut next) = next else {
            self.gone = true;
            self.chunk.items.clear();
            return;
        };
        next.items.clear();
        next.header = self.chunk.header.clone();
        let full = std::mem::replace(&mut self.chunk, next);
        if let Err(mpsc::SendError(mut full)) = self.to_worker.send(full) {
            self.gone = true;
            full.items.clear();
            self.chunk = full;
        }
    }

    /// Hands over what is left and waits for the worker to consume every
    /// event; returns it (`Err`: its panic).
    pub fn finish(self) -> std::thread::Result<W> {
        let Feed {
            chunk,
            to_worker,
            returned,
            worker,
            ..
        } = self;
        if !chunk.items.is_empty() {
            let _ = to_worker.send(chunk);
        }
        drop((to_worker, returned));
        worker.join()
    }
}

#[cfg(test)]
mod tests {
    use super::{Feed, Shape, Work};

    /// Keeps what it got, with each chunk's header.
    #[derive(Default)]
    struct Keep(Vec<(u32, Vec<u64>)>);

    impl Work<u64, u32> for Keep {
        fn chunk(&mut self, header: &u32, items: &[u64]) {
            self.0.push((*header, items.to_vec()));
        }
    }

    /// Every event arrives once, in order, under the header it was pushed
    /// under, whatever the shape; a flushed header arrives even with no
    /// events.
    #[test]
    fn events_arrive_in_order_under_their_header() {
        for shape in [
            Shape { chunk: 1, queue: 0 },
            Shape { chunk: 3, queue: 0 },
            Shape { chunk: 7, queue: 4 },
        ] {
            let got = std::thread::scope(|scope| {
                let mut feed = Feed::start(scope, "test", shape, 0, Keep::default()).unwrap();
                let mut want = Vec::new();
                for header in 1..=5u32 {
                    feed.open(header);
                    if header == 3 {
                        feed.flush();
                        continue;
                    }
                    for i in 0..20 * u64::from(header) {
                        let item = u64::from(header) * 1000 + i;
                        feed.push(item);
                        want.push((header, item));
                    }
                }
                assert!(!feed.is_gone());
                (feed.finish().unwrap(), want)
            });
            let (keep, want) = got;
            assert!(
                keep.0.iter().all(|(_, v)| v.len() <= shape.chunk),
                "{shape:?}"
            );
            assert!(
                keep.0.iter().any(|(h, v)| *h == 3 && v.is_empty()),
                "{shape:?}"
            );
            let flat: Vec<(u32, u64)> = keep
                .0
                .iter()
                .flat_map(|(h, v)| v.iter().map(move |&i| (*h, i)))
                .collect();
            assert_eq!(flat, want, "{shape:?}");
        }
    }

    struct Panics;

    impl Work<u64, ()> for Panics {
        fn chunk(&mut self, _: &(), _: &[u64]) {
            panic!("the worker fails");
        }
    }

    /// A worker that panics: the reading thread goes on without blocking,
    /// and `finish` returns the panic.
    #[test]
    fn a_failed_worker_is_reported() {
        let result = std::thread::scope(|scope| {
            let shape = Shape { chunk: 2, queue: 0 };
            let mut feed = Feed::start(scope, "test", shape, (), Panics).unwrap();
            for i in 0..1000 {
                feed.push(i);
            }
            assert!(feed.is_gone());
            feed.finish().map(|_| ())
        });
        assert!(result.is_err());
    }
}
