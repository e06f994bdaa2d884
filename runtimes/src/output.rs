//! A process's standard streams through FIFOs: combined output read with its tail kept within a
//! limit, and input written then closed.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::task::JoinHandle;

/// Keeps the last `limit` bytes written to it and whether anything was dropped.
#[derive(Debug)]
pub struct TailBuffer {
    limit: usize,
    bytes: VecDeque<u8>,
    truncated: bool,
}

impl TailBuffer {
    pub fn new(limit: usize) -> TailBuffer {
        TailBuffer {
            limit,
            bytes: VecDeque::with_capacity(limit.min(64 * 1024)),
            truncated: false,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        let chunk = if chunk.len() > self.limit {
            self.truncated = true;
            &chunk[chunk.len() - self.limit..]
        } else {
            chunk
        };
        let overflow = (self.bytes.len() + chunk.len()).saturating_sub(self.limit);
        if overflow > 0 {
            self.truncated = true;
            self.bytes.drain(..overflow);
        }
        self.bytes.extend(chunk);
    }

    /// The kept bytes and whether earlier ones were dropped.
    pub fn finish(self) -> (Vec<u8>, bool) {
        (self.bytes.into(), self.truncated)
    }
}

/// A named pipe the runtime writes a process's stdout and stderr into, read as it is written.
pub struct OutputFifo {
    path: PathBuf,
    /// The reader while it runs; it ends at end of file, or when told to stop.
    reader: Option<JoinHandle<TailBuffer>>,
    /// What the reader read, once it ended.
    read: Option<TailBuffer>,
    /// Tells the reader to take what is already in the pipe and end.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Our own write end, held until the runtime has opened its own: a FIFO with no writer
    /// reads as ended, and the reader would stop before the process started.
    placeholder: Option<std::fs::File>,
}

impl OutputFifo {
    /// Makes the FIFO at `path` and starts reading it. The read end is opened before the
    /// runtime opens the write end, so nothing the process writes is lost.
    pub fn create(
        path: &Path,
        limit: usize,
        sink: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
    ) -> std::io::Result<OutputFifo> {
        let _ = std::fs::remove_file(path);
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(std::io::Error::from)?;
        let receiver = tokio::net::unix::pipe::OpenOptions::new().open_receiver(path)?;
        let placeholder = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
                .open(path)?
        };
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(read_into_tail(receiver, limit, sink, stopped));
        Ok(OutputFifo {
            path: path.to_owned(),
            reader: Some(reader),
            read: None,
            stop: Some(stop),
            placeholder: Some(placeholder),
        })
    }

    /// Called once the runtime holds the write end (its process started, or failed to): from
    /// now on the output ends when the process's side closes.
    pub fn writer_attached(&mut self) {
        self.placeholder = None;
    }

    /// The path to give the runtime as stdout and stderr.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `grace` for every writer to close, the reader still reading after: true when
    /// the output ended. The runtime may stop copying once the process is deleted, so this
    /// comes before the delete.
    pub async fn wait_closed(&mut self, grace: Duration) -> bool {
        self.placeholder = None;
        let Some(reader) = self.reader.as_mut() else {
            return true;
        };
        match tokio::time::timeout(grace, reader).await {
            Ok(tail) => {
                self.reader = None;
                self.read = tail.ok();
                true
            }
            Err(_) => false,
        }
    }

    /// Waits up to `grace` for the writers to close (a background child that kept stdout open
    /// must not hold the answer hostage), then returns what was read: all of it, also when the
    /// grace ran out, including what was still in the pipe.
    pub async fn collect(mut self, grace: Duration) -> (Vec<u8>, bool) {
        if !self.wait_closed(grace).await {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            if let Some(reader) = self.reader.take() {
                self.read = reader.await.ok();
            }
        }
        self.read.take().map(TailBuffer::finish).unwrap_or_default()
    }
}

/// Reads `receiver` into a tail of `limit` bytes, passing each chunk to `sink`, until end of
/// file, or until `stop` (then what is already in the pipe is still taken).
async fn read_into_tail(
    mut receiver: tokio::net::unix::pipe::Receiver,
    limit: usize,
    sink: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> TailBuffer {
    let mut tail = TailBuffer::new(limit);
    let mut chunk = vec![0u8; 32 * 1024];
    // After `stop`, how many more chunks may be taken without waiting: what a pipe holds,
    // and not forever from a writer that keeps writing.
    let mut last_chunks: Option<u32> = None;
    loop {
        let n = match last_chunks.as_mut() {
            Some(0) => 0,
            Some(left) => {
                *left -= 1;
                receiver.try_read(&mut chunk).unwrap_or(0)
            }
            None => tokio::select! {
                biased;
                _ = &mut stop => {
                    last_chunks = Some(64);
                    continue;
                }
                read = receiver.read(&mut chunk) => read.unwrap_or(0),
            },
        };
        if n == 0 {
            break;
        }
        tail.push(&chunk[..n]);
        if let Some(sink) = &sink {
            // A receiver that went away stops the process elsewhere; keep draining so the
            // tail is complete.
            let _ = sink.send(chunk[..n].to_vec()).await;
        }
    }
    tail
}

impl Drop for OutputFifo {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A named pipe the runtime reads a process's standard input from: `bytes`, then end of file.
pub struct InputFifo {
    path: PathBuf,
    writer: JoinHandle<()>,
}

impl InputFifo {
    /// Makes the FIFO at `path` and starts writing `bytes` into it once the runtime has opened
    /// it for reading (a FIFO's buffer lives only while some end is open, so writing earlier
    /// and closing could lose the bytes). Closing our end after the last byte is, with the
    /// runtime's own end closed, the process's end of file.
    pub fn create(path: &Path, bytes: Vec<u8>) -> std::io::Result<InputFifo> {
        use tokio::io::AsyncWriteExt;
        let _ = std::fs::remove_file(path);
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(std::io::Error::from)?;
        let fifo = path.to_owned();
        let writer = tokio::spawn(async move {
            let mut sender = loop {
                match tokio::net::unix::pipe::OpenOptions::new().open_sender(&fifo) {
                    Ok(sender) => break sender,
                    // No reader yet (ENXIO): the runtime opens it when the process starts.
                    Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    Err(_) => return,
                }
            };
            // A process that exits without reading everything ends the write; that is fine.
            let _ = sender.write_all(&bytes).await;
            let _ = sender.shutdown().await;
        });
        Ok(InputFifo {
            path: path.to_owned(),
            writer,
        })
    }

    /// The path to give the runtime as stdin.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves once every byte is in the pipe (or the reader went away).
    pub async fn written(&mut self) {
        let _ = (&mut self.writer).await;
    }
}

impl Drop for InputFifo {
    fn drop(&mut self) {
        self.writer.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut t = TailBuffer::new(5);
        t.push(b"abc");
        assert_eq!(TailBuffer::new(5).finish(), (Vec::new(), false));
        t.push(b"def");
        t.push(b"g");
        assert_eq!(t.finish(), (b"cdefg".to_vec(), true));
        let mut big = TailBuffer::new(3);
        big.push(b"0123456789");
        assert_eq!(big.finish(), (b"789".to_vec(), true));
        let mut exact = TailBuffer::new(3);
        exact.push(b"abc");
        assert_eq!(exact.finish(), (b"abc".to_vec(), false));
    }

    #[tokio::test]
    async fn fifo_collects_what_a_writer_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let mut fifo = OutputFifo::create(&dir.path().join("out"), 1024, Some(tx)).unwrap();
        let path = fifo.path().to_owned();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut w = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            w.write_all(b"hello ").unwrap();
            w.write_all(b"world").unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        fifo.writer_attached();
        let (out, truncated) = fifo.collect(Duration::from_secs(5)).await;
        assert_eq!(out, b"hello world");
        assert!(!truncated);
        let mut streamed = Vec::new();
        while let Some(chunk) = rx.recv().await {
            streamed.extend(chunk);
        }
        assert_eq!(streamed, b"hello world");
    }

    #[tokio::test]
    async fn what_was_written_is_kept_when_a_writer_outlives_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let mut fifo = OutputFifo::create(&dir.path().join("out"), 1024, None).unwrap();
        let path = fifo.path().to_owned();
        let (written, was_written) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        // A background child that keeps the output open after writing.
        let holder = std::thread::spawn(move || {
            use std::io::Write;
            let mut w = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            w.write_all(b"partial").unwrap();
            written.send(()).unwrap();
            let _ = released.recv();
        });
        was_written.recv().unwrap();
        fifo.writer_attached();
        assert!(!fifo.wait_closed(Duration::from_millis(50)).await);
        let (out, truncated) = fifo.collect(Duration::from_millis(50)).await;
        assert_eq!(out, b"partial");
        assert!(!truncated);
        release.send(()).unwrap();
        holder.join().unwrap();
    }
}
