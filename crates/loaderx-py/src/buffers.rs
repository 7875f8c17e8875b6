//! Borrowing Python buffers as Rust slices: the only `unsafe` of the binding.
//!
//! The caller keeps the `PyBuffer` alive for as long as the slice is used; while a buffer is
//! exported its memory can be neither freed nor resized, so the slice stays valid even with the
//! GIL released. Python code that writes the same memory from another thread at the same time
//! races with us exactly as it would with any `NumPy` operation that releases the GIL.
#![expect(unsafe_code, reason = "views of exported Python buffers as slices")]

use pyo3::buffer::{Element, PyBuffer};
use pyo3::prelude::*;

/// A read-only view of a C-contiguous buffer.
pub fn slice<'b, T: Element>(buf: &'b PyBuffer<T>, what: &str) -> PyResult<&'b [T]> {
    if !buf.is_c_contiguous() {
        return Err(crate::errors::bad_argument(format!("{what} must be C-contiguous")));
    }
    if buf.item_count() == 0 {
        return Ok(&[]);
    }
    // SAFETY: `PyBuffer::<T>::get` checked the item type and alignment; the buffer is
    // C-contiguous, so `item_count` items lie contiguously from `buf_ptr`; its export (held by
    // `buf`, which outlives the returned borrow) keeps the memory alive and unresized.
    Ok(unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const T, buf.item_count()) })
}

/// A writable view of a C-contiguous, writable buffer.
#[allow(clippy::mut_from_ref)] // the memory belongs to the Python object, not to `buf`
pub fn slice_mut<'b, T: Element>(buf: &'b PyBuffer<T>, what: &str) -> PyResult<&'b mut [T]> {
    if buf.readonly() {
        return Err(crate::errors::bad_argument(format!("{what} is read-only")));
    }
    if !buf.is_c_contiguous() {
        return Err(crate::errors::bad_argument(format!("{what} must be C-contiguous")));
    }
    if buf.item_count() == 0 {
        return Ok(&mut []);
    }
    // SAFETY: as in `slice`, plus the exporter reported the buffer writable. Callers copy every
    // other argument out of Python memory before taking this view, so no Rust reference aliases
    // it.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr().cast::<T>(), buf.item_count()) })
}

/// Whether two buffers' memory ranges intersect (then one may not be borrowed mutably while
/// the other is borrowed at all).
pub fn overlap<A: Element, B: Element>(a: &PyBuffer<A>, b: &PyBuffer<B>) -> bool {
    let start = |p: *mut std::ffi::c_void| p as usize;
    let (a0, b0) = (start(a.buf_ptr()), start(b.buf_ptr()));
    let (a1, b1) = (a0 + a.len_bytes(), b0 + b.len_bytes());
    a.len_bytes() > 0 && b.len_bytes() > 0 && a0 < b1 && b0 < a1
}

/// The values of `obj` when it is a buffer of uint64, or of int64 with no negative value: the
/// index and offset arrays clients usually hold. `None` for anything else (another dtype, a
/// negative value, not a buffer); the Python layer then converts it and reports what is wrong.
pub fn u64_values(py: Python<'_>, obj: &Bound<'_, PyAny>) -> Option<Vec<u64>> {
    if let Ok(buf) = PyBuffer::<u64>::get(obj) {
        return buf.to_vec(py).ok();
    }
    let signed = PyBuffer::<i64>::get(obj).ok()?.to_vec(py).ok()?;
    signed.iter().map(|&v| u64::try_from(v).ok()).collect()
}

/// `obj` as a writable C-contiguous byte buffer, or `None` (another dtype, read-only, strided).
pub fn writable_bytes(obj: &Bound<'_, PyAny>) -> Option<PyBuffer<u8>> {
    let buf = PyBuffer::<u8>::get(obj).ok()?;
    (!buf.readonly() && buf.is_c_contiguous()).then_some(buf)
}

/// A buffer of uint16, uint32 or uint64 values (a plan keeps its entries as small as they fit).
pub enum IndexBuffer {
    U16(PyBuffer<u16>),
    U32(PyBuffer<u32>),
    U64(PyBuffer<u64>),
}

/// The values of an [`IndexBuffer`], borrowed.
#[derive(Clone, Copy)]
pub enum Indices<'b> {
    U16(&'b [u16]),
    U32(&'b [u32]),
    U64(&'b [u64]),
}

impl IndexBuffer {
    /// `obj` as uint16, uint32 or uint64 values; anything else is refused naming `what`.
    pub fn get(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        if let Ok(b) = PyBuffer::<u32>::get(obj) {
            return Ok(IndexBuffer::U32(b));
        }
        if let Ok(b) = PyBuffer::<u16>::get(obj) {
            return Ok(IndexBuffer::U16(b));
        }
        PyBuffer::<u64>::get(obj).map(IndexBuffer::U64).map_err(|_| {
            crate::errors::bad_argument(format!("{what} must be a uint16, uint32 or uint64 array"))
        })
    }

    pub fn len(&self) -> usize {
        match self {
            IndexBuffer::U16(b) => b.item_count(),
            IndexBuffer::U32(b) => b.item_count(),
            IndexBuffer::U64(b) => b.item_count(),
        }
    }

    pub fn values(&self) -> PyResult<Indices<'_>> {
        Ok(match self {
            IndexBuffer::U16(b) => Indices::U16(slice(b, "indices")?),
            IndexBuffer::U32(b) => Indices::U32(slice(b, "indices")?),
            IndexBuffer::U64(b) => Indices::U64(slice(b, "indices")?),
        })
    }
}

impl Indices<'_> {
    /// Entry `k` (the caller checked that `k` is in range).
    pub fn get(self, k: usize) -> u64 {
        match self {
            Indices::U16(v) => u64::from(v[k]),
            Indices::U32(v) => u64::from(v[k]),
            Indices::U64(v) => v[k],
        }
    }

    /// Entry `k`, or `None` past the end.
    pub fn try_get(self, k: u64) -> Option<u64> {
        let k = usize::try_from(k).ok()?;
        match self {
            Indices::U16(v) => v.get(k).map(|&x| u64::from(x)),
            Indices::U32(v) => v.get(k).map(|&x| u64::from(x)),
            Indices::U64(v) => v.get(k).copied(),
        }
    }
}

/// Refuses a lengths output that is not a writable, C-contiguous uint32 array of `n` items.
pub fn check_lengths_out(out: &PyBuffer<u32>, n: usize) -> PyResult<()> {
    if out.item_count() != n || out.readonly() || !out.is_c_contiguous() {
        return Err(crate::errors::bad_argument(
            "out must be a writable uint32 array of len(idxs)",
        ));
    }
    Ok(())
}
