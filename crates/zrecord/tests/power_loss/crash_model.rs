//! A model of what a disk may hold after a power cut, built from a snapshot of a store directory
//! and the journal of changes the engine made afterwards (`zrecord::disk::Change`).
//!
//! The rules are POSIX's, taken at their weakest: a file's contents and size are durable only
//! up to its last `SyncFile`; a name (creation, rename, removal) only up to the last `SyncDir`;
//! everything later may or may not have reached the disk, in any combination, and a write may be
//! torn at 512-byte sector boundaries.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use zrecord::disk::Change;

use crate::common::Rng;

const PAGE: u64 = 4096;
const SECTOR: u64 = 512;

/// A file's bytes, sparse: pages never written read as zeros.
#[derive(Clone, Default)]
pub struct Image {
    len: u64,
    pages: BTreeMap<u64, Vec<u8>>,
}

impl Image {
    /// Reads `path`, keeping only pages that hold a non-zero byte (holes stay holes).
    pub fn read(path: &Path) -> Image {
        let file = File::open(path).unwrap();
        let len = file.metadata().unwrap().len();
        let mut image = Image { len, pages: BTreeMap::new() };
        let mut block = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < len {
            let n = file.read_at(&mut block, at).unwrap();
            assert!(n > 0, "short read of {}", path.display());
            for (i, page) in block[..n].chunks(PAGE as usize).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    let mut p = page.to_vec();
                    p.resize(PAGE as usize, 0);
                    image.pages.insert(at / PAGE + i as u64, p);
                }
            }
            at += n as u64;
        }
        image
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let (page, within) = (at / PAGE, (at % PAGE) as usize);
            let n = (PAGE as usize - within).min(data.len() - done);
            let p = self.pages.entry(page).or_insert_with(|| vec![0u8; PAGE as usize]);
            p[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        self.len = self.len.max(offset + data.len() as u64);
    }

    /// Zeroes `len` bytes at `offset` inside the file, keeping its size (a punched hole).
    pub fn punch(&mut self, offset: u64, len: u64) -> Vec<u8> {
        let end = (offset + len).min(self.len);
        let zeros = vec![0u8; end.saturating_sub(offset) as usize];
        if !zeros.is_empty() {
            self.write(offset, &zeros);
        }
        zeros
    }

    pub fn set_len(&mut self, len: u64) {
        if len < self.len {
            self.pages.retain(|&p, _| p * PAGE < len);
            if let Some(last) = self.pages.get_mut(&(len / PAGE)) {
                last[(len % PAGE) as usize..].fill(0);
            }
        }
        self.len = len;
    }

    /// Writes the image to `path` (a new file), keeping holes as holes.
    pub fn materialize(&self, path: &Path) {
        let f = OpenOptions::new().write(true).create_new(true).open(path).unwrap();
        f.set_len(self.len).unwrap();
        for (&p, bytes) in &self.pages {
            let at = p * PAGE;
            if at < self.len {
                let n = ((self.len - at) as usize).min(bytes.len());
                f.write_all_at(&bytes[..n], at).unwrap();
            }
        }
    }
}

enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

struct Inode {
    durable: Image,
    current: Image,
    pending: Vec<Pending>,
}

/// How the unsynced changes fare in a cut.
#[derive(Clone, Copy, Debug)]
pub enum Fate {
    /// None reached the disk.
    AllLost,
    /// All of them did (what a process kill leaves).
    AllKept,
    /// Each change, name and sector independently, drawn from this seed.
    Random(u64),
}

/// The files of one store directory, replayed change by change.
pub struct World {
    dir: PathBuf,
    inodes: Vec<Inode>,
    durable_names: BTreeMap<String, usize>,
    names: BTreeMap<String, usize>,
}

impl World {
    /// The directory as it is now, taken as durable (the test synced it).
    pub fn snapshot(dir: &Path) -> World {
        let mut world = World {
            dir: dir.to_path_buf(),
            inodes: Vec::new(),
            durable_names: BTreeMap::new(),
            names: BTreeMap::new(),
        };
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let image = Image::read(&entry.path());
            world.inodes.push(Inode { durable: image.clone(), current: image, pending: vec![] });
            world.names.insert(name.clone(), world.inodes.len() - 1);
            world.durable_names.insert(name, world.inodes.len() - 1);
        }
        world
    }

    fn name(&self, path: &Path) -> String {
        assert_eq!(path.parent().unwrap(), self.dir, "change outside the store directory");
        path.file_name().unwrap().to_str().unwrap().to_string()
    }

    fn inode(&mut self, path: &Path) -> &mut Inode {
        let name = self.name(path);
        let id = *self.names.get(&name).unwrap_or_else(|| panic!("{name} changed but absent"));
        &mut self.inodes[id]
    }

    /// Applies one journaled change.
    pub fn apply(&mut self, change: &Change) {
        match change {
            Change::Create { file } => {
                let name = self.name(file);
                let empty = Image::default();
                let inode = Inode { durable: empty.clone(), current: empty, pending: vec![] };
                self.inodes.push(inode);
                self.names.insert(name, self.inodes.len() - 1);
            }
            Change::Write { file, offset, data } => {
                let inode = self.inode(file);
                inode.current.write(*offset, data);
                inode.pending.push(Pending::Write(*offset, data.clone()));
            }
            Change::SetLen { file, len } => {
                let inode = self.inode(file);
                inode.current.set_len(*len);
                inode.pending.push(Pending::SetLen(*len));
            }
            Change::PunchHole { file, offset, len } => {
                let inode = self.inode(file);
                let zeros = inode.current.punch(*offset, *len);
                inode.pending.push(Pending::Write(*offset, zeros));
            }
            Change::SyncFile { file } => {
                let inode = self.inode(file);
                inode.durable = inode.current.clone();
                inode.pending.clear();
            }
            Change::Rename { from, to } => {
                let id = self.names.remove(&self.name(from)).expect("rename of a missing file");
                self.names.insert(self.name(to), id);
            }
            Change::Exchange { a, b } => {
                let (a, b) = (self.name(a), self.name(b));
                let first = self.names.remove(&a).expect("exchange of a missing file");
                let second = self.names.remove(&b).expect("exchange of a missing file");
                self.names.insert(a, second);
                self.names.insert(b, first);
            }
            Change::Remove { file } => {
                self.names.remove(&self.name(file));
            }
            Change::SyncDir { dir } => {
                assert_eq!(dir, &self.dir);
                self.durable_names = self.names.clone();
            }
        }
    }

    /// Writes what the disk could hold after a cut now, under `fate`, into the empty `out`.
    pub fn crash_into(&self, fate: Fate, out: &Path) {
        let mut rng = Rng(match fate {
            Fate::Random(seed) => seed,
            _ => 0,
        });
        let mut coin = |p_percent: u64| rng.below(100) < p_percent;
        let all: BTreeSet<&String> = self.names.keys().chain(self.durable_names.keys()).collect();
        for name in all {
            let (durable, current) = (self.durable_names.get(name), self.names.get(name));
            let id = match (fate, durable == current) {
                (_, true) | (Fate::AllLost, false) => durable,
                (Fate::AllKept, false) => current,
                (Fate::Random(_), false) => {
                    if coin(50) {
                        current
                    } else {
                        durable
                    }
                }
            };
            let Some(&id) = id else { continue };
            let inode = &self.inodes[id];
            let image = match fate {
                Fate::AllLost => inode.durable.clone(),
                Fate::AllKept => inode.current.clone(),
                Fate::Random(_) => {
                    let mut image = inode.durable.clone();
                    for change in &inode.pending {
                        match change {
                            Pending::SetLen(len) => {
                                if coin(50) {
                                    image.set_len(*len);
                                }
                            }
                            Pending::Write(offset, data) => {
                                let torn = coin(25);
                                if !torn && coin(50) {
                                    image.write(*offset, data);
                                } else if torn {
                                    write_some_sectors(&mut image, *offset, data, &mut coin);
                                }
                            }
                        }
                    }
                    image
                }
            };
            image.materialize(&out.join(name));
        }
    }
}

/// Applies the sectors of a write that a coin keeps: a write torn by the power cut.
fn write_some_sectors(
    image: &mut Image,
    offset: u64,
    data: &[u8],
    coin: &mut impl FnMut(u64) -> bool,
) {
    let end = offset + data.len() as u64;
    let mut at = offset;
    while at < end {
        let next = ((at / SECTOR) + 1) * SECTOR;
        let piece_end = next.min(end);
        if coin(50) {
            let range = (at - offset) as usize..(piece_end - offset) as usize;
            image.write(at, &data[range]);
        }
        at = piece_end;
    }
}
