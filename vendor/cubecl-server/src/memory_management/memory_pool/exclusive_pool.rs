use crate::memory_management::Cleanup;
use crate::{
    memory_management::{
        BytesFormat, ErrorGraph, MemoryLocation, MemoryPoolKind, MemoryPoolReport, MemoryUsage,
        PageGuard,
    },
    server::IoError,
    storage::{ComputeStorage, StorageUtilization},
};

use alloc::vec::Vec;
use cubecl_environment::backtrace::BackTrace;

use super::{
    ManagedMemoryBinding, ManagedMemoryHandle, MemoryPool, PageMapping, Slice, calculate_padding,
};

/// A memory pool that allocates buffers in a range of sizes and reuses them to minimize allocations.
///
/// - Only one slice is supported per page, due to the limitations in WGPU where each buffer should only bound with
///   either read only or `read_write` slices but not a mix of both.
/// - The pool uses a ring buffer to efficiently manage and reuse pages.
pub struct ExclusiveMemoryPool {
    pages: Vec<MemoryPage>,
    pages_tmp: Vec<MemoryPage>,
    alignment: u64,
    dealloc_period: u64,
    last_dealloc_check: u64,
    max_alloc_size: u64,
    cur_avg_size: f64,
    location_base: MemoryLocation,
    /// The most pages ever held at once (pages come and go with
    /// `dealloc_period`, so the current count understates the peak).
    pages_peak: u64,
    /// The largest allocation ever served, in requested (pre-padding) bytes.
    largest_alloc: u64,
    /// The pages handed out last, newest last: a step's temporaries are
    /// freed soon after they are made, so these are looked at first.
    recent: Vec<usize>,
    /// Pages a sweep found free and nothing has taken since.
    found: Vec<usize>,
    /// Where the next sweep of the pages starts.
    cursor: usize,
}

impl core::fmt::Display for ExclusiveMemoryPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_fmt(format_args!(
            " - Exclusive Pool max_alloc_size={}\n",
            BytesFormat::new(self.max_alloc_size)
        ))?;

        for page in self.pages.iter() {
            let is_free = page.slice.is_free();
            let size = BytesFormat::new(page.slice.effective_size());

            f.write_fmt(format_args!("   - Page {size} is_free={is_free}\n"))?;
        }

        if !self.pages.is_empty() {
            f.write_fmt(format_args!("\n{}\n", self.get_memory_usage()))?;
        }

        Ok(())
    }
}

const SIZE_AVG_DECAY: f64 = 0.01;

/// How many of the pages handed out last a reservation looks at first.
const RECENT_PAGES: usize = 32;
/// How many pages one reservation sweeps, at most, for free ones.
const SWEEP_PAGES: usize = 64;

// How many times to find the allocation 'free' before deallocating it.
const ALLOC_AFTER_FREE: u32 = 5;

struct MemoryPage {
    slice: Slice,
    alloc_size: u64,
    free_count: u32,
    /// Whether the page's index is in the pool's `found`.
    found: bool,
}

/// What an [`ExclusiveMemoryPool`] serves, and the pool index its pages carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExclusiveLayout {
    /// The largest allocation the pool accepts, a multiple of the alignment.
    pub max_alloc_size: u64,
    /// The alignment every page is allocated at.
    pub alignment: u64,
    /// The allocations an unused page waits through before it is released;
    /// `u64::MAX` keeps it for good.
    pub dealloc_period: u64,
    /// The pool index a page's location carries.
    pub pool: u8,
}

impl ExclusiveMemoryPool {
    /// A pool serving what `layout` says.
    pub(crate) fn new(layout: ExclusiveLayout) -> Self {
        // Pages should be allocated to be aligned.
        assert_eq!(layout.max_alloc_size % layout.alignment, 0);

        Self {
            pages: Vec::new(),
            pages_tmp: Vec::new(),
            alignment: layout.alignment,
            dealloc_period: layout.dealloc_period,
            last_dealloc_check: 0,
            max_alloc_size: layout.max_alloc_size,
            cur_avg_size: layout.max_alloc_size as f64 / 2.0,
            location_base: MemoryLocation::new(layout.pool, 0, 0),
            pages_peak: 0,
            largest_alloc: 0,
            recent: Vec::with_capacity(RECENT_PAGES),
            found: Vec::new(),
            cursor: 0,
        }
    }

    /// Remembers `index` as the page handed out last.
    fn note_recent(&mut self, index: usize) {
        if self.recent.len() == RECENT_PAGES {
            self.recent.remove(0);
        }
        self.recent.push(index);
    }

    /// A structured snapshot of the pool: shape, usage, high-water marks.
    pub(crate) fn report(&self) -> MemoryPoolReport {
        MemoryPoolReport {
            kind: MemoryPoolKind::Exclusive {
                max_alloc_size: self.max_alloc_size,
            },
            usage: self.get_memory_usage(),
            pages: self.pages.len() as u64,
            pages_peak: self.pages_peak,
            // This pool only allocates eagerly.
            pages_unmapped: 0,
            largest_alloc: self.largest_alloc,
        }
    }

    /// Finds a free page that can contain the given size
    /// Returns a slice on that page if successful.
    ///
    /// A page becomes free when the last handle to it outside the pool is
    /// dropped, which the pool learns only by looking at the page. Looking at
    /// every page on every reservation costs as much as the pages a workload
    /// keeps alive (a supernet keeps thousands between its forward and
    /// backward passes), so a reservation looks, in turn, at the pages handed
    /// out last (the temporaries a workload frees soon after making them),
    /// at the pages earlier sweeps found free, and at the next
    /// [`SWEEP_PAGES`] pages from a cursor that walks the pool round. A page
    /// freed elsewhere is found within `pages / SWEEP_PAGES` reservations;
    /// until then the pool may grow by a page it would otherwise reuse.
    fn get_free_page(&mut self, size: u64) -> Option<usize> {
        let fits = |page: &MemoryPage| page.alloc_size >= size && page.slice.is_free();

        if let Some(position) = self
            .recent
            .iter()
            .rposition(|&index| self.pages.get(index).is_some_and(fits))
        {
            let index = self.recent.remove(position);
            // Its entry in `found`, if any, is now stale.
            self.pages[index].found = false;
            return Some(index);
        }

        // A found page stays free until this pool hands it out (the check is
        // kept for a page a bind gave another handle). An entry whose page
        // was taken another way is stale: its flag is down.
        let mut position = self.found.len();
        let mut looked = 0;
        while position > 0 && looked < SWEEP_PAGES {
            position -= 1;
            looked += 1;
            let index = self.found[position];
            let page = &mut self.pages[index];
            if !page.found || !page.slice.is_free() {
                page.found = false;
                self.found.swap_remove(position);
            } else if page.alloc_size >= size {
                page.found = false;
                self.found.swap_remove(position);
                return Some(index);
            }
        }

        let count = self.pages.len();
        for _ in 0..SWEEP_PAGES.min(count) {
            if self.cursor >= count {
                self.cursor = 0;
            }
            let index = self.cursor;
            self.cursor += 1;
            let page = &mut self.pages[index];
            if page.found || !page.slice.is_free() {
                continue;
            }
            if page.alloc_size >= size {
                return Some(index);
            }
            page.found = true;
            self.found.push(index);
        }
        None
    }

    fn alloc_page<Storage: ComputeStorage>(
        &mut self,
        storage: &mut Storage,
        size: u64,
    ) -> Result<(usize, &mut MemoryPage), IoError> {
        let alloc_size = (self.cur_avg_size as u64)
            .max(size)
            .next_multiple_of(self.alignment);

        let storage = storage.alloc(alloc_size)?;

        let padding = calculate_padding(size, self.alignment);
        let mut slice = Slice::new(storage, padding);

        // Return a smaller part of the slice. By construction, we only ever
        // get a page with a big enough size, so this is ok to do.
        slice.storage.utilization = StorageUtilization { offset: 0, size };
        slice.padding = padding;

        self.pages.push(MemoryPage {
            slice,
            alloc_size,
            // Start the allocation at 'almost ready to free'. Every use will decrement this.
            // This means allocations start as "suspected as unused" and over time will be kept for longer.
            free_count: ALLOC_AFTER_FREE - 1,
            found: false,
        });
        self.pages_peak = self.pages_peak.max(self.pages.len() as u64);

        let idx = self.pages.len() - 1;
        self.note_recent(idx);
        Ok((idx, &mut self.pages[idx]))
    }
}

impl MemoryPool for ExclusiveMemoryPool {
    fn accept(&self, size: u64) -> bool {
        self.max_alloc_size >= size
    }

    /// Reserves memory of specified size using the reserve algorithm, and return
    /// a handle to the reserved memory.
    ///
    /// Also clean ups, merging free slices together if permitted by the merging strategy
    fn try_reserve(
        &mut self,
        size: u64,
        _failures: &mut ErrorGraph,
    ) -> Option<ManagedMemoryHandle> {
        self.cur_avg_size =
            self.cur_avg_size * (1.0 - SIZE_AVG_DECAY) + size as f64 * SIZE_AVG_DECAY;

        let padding = calculate_padding(size, self.alignment);

        let index = self.get_free_page(size);
        let handle = index.map(|index| {
            let page = &mut self.pages[index];
            // Return a smaller part of the slice. By construction, we only ever
            // get a page with a big enough size, so this is ok to do.
            page.slice.storage.utilization = StorageUtilization { offset: 0, size };
            page.slice.padding = padding;
            page.free_count = page.free_count.saturating_sub(1);
            page.slice.handle.clone()
        });
        if let Some(index) = index {
            self.note_recent(index);
        }

        if handle.is_some() {
            self.largest_alloc = self.largest_alloc.max(size);
        }

        handle
    }

    #[cfg_attr(
        feature = "tracing",
        tracing::instrument(level = "trace", skip(self, storage))
    )]
    fn alloc<Storage: ComputeStorage>(
        &mut self,
        storage: &mut Storage,
        size: u64,
        // Always eager: this pool serves the preset layouts and the auxiliary
        // (staging/uniform/pinned) managers, whose buffers are written right
        // after reservation — laziness would only move the same allocation
        // one call later.
        _mapping: PageMapping,
        _failures: &mut ErrorGraph,
    ) -> Result<ManagedMemoryHandle, IoError> {
        if size > self.max_alloc_size {
            return Err(IoError::BufferTooBig {
                size,
                backtrace: BackTrace::capture(),
            });
        }

        let (idx, page) = self.alloc_page(storage, size)?;
        let handle = page.slice.handle.clone();
        let mut location = self.location_base;
        location.page = idx as u16;
        handle.descriptor().update_location(location);
        self.largest_alloc = self.largest_alloc.max(size);

        Ok(handle)
    }

    fn guard(&mut self, location: MemoryLocation) -> Option<PageGuard> {
        let page = self.pages.get(location.page as usize)?;
        Some(PageGuard::allocation(page.slice.handle.clone().binding()))
    }

    fn get_memory_usage(&self) -> MemoryUsage {
        let used_slices: Vec<_> = self
            .pages
            .iter()
            .filter(|page| !page.slice.is_free())
            .collect();

        MemoryUsage {
            number_allocs: used_slices.len() as u64,
            bytes_in_use: used_slices
                .iter()
                .map(|page| page.slice.storage.size())
                .sum(),
            bytes_padding: used_slices.iter().map(|page| page.slice.padding).sum(),
            bytes_reserved: self.pages.iter().map(|page| page.alloc_size).sum(),
        }
    }

    fn cleanup<Storage: ComputeStorage>(
        &mut self,
        storage: &mut Storage,
        alloc_nr: u64,
        cleanup: Cleanup,
        failures: &mut ErrorGraph,
    ) {
        // Check such that an alloc is free after at most dealloc_period.
        let check_period = self.dealloc_period / (ALLOC_AFTER_FREE as u64);

        if cleanup == Cleanup::Explicit || alloc_nr - self.last_dealloc_check >= check_period {
            self.last_dealloc_check = alloc_nr;
            // The pages are renumbered below.
            self.recent.clear();
            self.found.clear();
            self.cursor = 0;

            for mut page in self.pages.drain(..) {
                if page.slice.is_free() {
                    page.free_count += 1;

                    // If free found is sufficiently high (ie. we've seen this alloc as free multiple times,
                    // without it being used in the meantime), deallocate it.
                    if page.free_count >= ALLOC_AFTER_FREE || cleanup == Cleanup::Explicit {
                        page.slice.tainted.clear(failures);
                        storage.dealloc(page.slice.storage.id);
                        continue;
                    }
                }

                page.found = false;
                let page_index = self.pages_tmp.len();
                page.slice
                    .handle
                    .descriptor()
                    .update_page(page_index as u16);
                self.pages_tmp.push(page);
            }

            core::mem::swap(&mut self.pages, &mut self.pages_tmp);
        }
    }

    fn bind(
        &mut self,
        old: ManagedMemoryHandle,
        new: ManagedMemoryHandle,
        cursor: u64,
        failures: &mut ErrorGraph,
    ) -> Result<(), IoError> {
        let id_old = old.descriptor();
        let page = &mut self.pages[id_old.page()];
        new.descriptor().update_location(id_old.location());

        page.slice.bind(new, failures);
        page.slice.cursor = cursor;

        Ok(())
    }

    fn find(&self, binding: &ManagedMemoryBinding) -> Result<&Slice, IoError> {
        let binding_descriptor = binding.descriptor();
        let page_index = binding_descriptor.page();

        let page = self
            .pages
            .get(page_index)
            .ok_or_else(|| IoError::NotFound {
                backtrace: BackTrace::capture(),
                reason: alloc::format!("Memory page {} doesn't exist", page_index).into(),
            })?;

        Ok(&page.slice)
    }

    fn find_mut(&mut self, binding: &ManagedMemoryBinding) -> Result<&mut Slice, IoError> {
        let binding_descriptor = binding.descriptor();
        let page_index = binding_descriptor.page();

        let page = self
            .pages
            .get_mut(page_index)
            .ok_or_else(|| IoError::NotFound {
                backtrace: BackTrace::capture(),
                reason: alloc::format!("Memory page {} doesn't exist", page_index).into(),
            })?;

        Ok(&mut page.slice)
    }
}
