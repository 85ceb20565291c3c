/* Keeps freed heap memory in the process instead of handing it back to the kernel.
 *
 * glibc serves a malloc of 128 KiB or more (a threshold that grows to 32 MiB as such
 * blocks are freed) with a fresh mmap and unmaps it on free, so every such malloc faults
 * its pages in again. OpenMPI's collectives allocate a message-sized temporary buffer on
 * every call, and on this machine's VM a page fault costs ~17 us (0.24 GB/s in 4 KiB
 * pages): a 2-rank 16 MiB MPI_Allreduce took 50 ms with glibc's defaults and 5.4 ms with
 * freed memory kept (docs/ARCHITECTURE.md, "Memory the allocator keeps"). */
#ifndef LOOM_CORE_MALLOC_POLICY_H
#define LOOM_CORE_MALLOC_POLICY_H

/* No mmap for malloc'd blocks, no trimming of the heap below 2 GiB free at its top, and
 * one arena for every thread (mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD INT_MAX, M_ARENA_MAX
 * 1), unless the user set one of glibc's MALLOC_MMAP_MAX_, MALLOC_MMAP_THRESHOLD_,
 * MALLOC_TRIM_THRESHOLD_ or MALLOC_ARENA_MAX (then glibc's reading of those stands). Call
 * it first in main, before MPI_Init and before any thread allocates. Returns 1 if it set
 * the policy. */
int loom_malloc_keep_pages(void);

/* The small-block reserve's bytes (1 MiB). */
#define LOOM_MALLOC_SMALL_RESERVE ((size_t)1 << 20)

/* Keeps small blocks away from the large temporaries that OpenMPI's collectives malloc
 * and free every call. glibc serves a block from the smallest free chunk that fits and
 * from the heap's top only when none does; with the heap kept, a large temporary comes
 * from the top and, freed, merges back into it. A small block allocated while a large
 * temporary is live (libnbc's schedule, grown by realloc; libgomp's team of a
 * one-thread parallel region) then lands right above the temporary, and one that
 * outlives it splits the freed space: the next temporary that is larger than the part
 * below does not fit and the heap grows by a whole temporary (traced in
 * docs/memory.md, "Heap fragmentation"). This leaves a free chunk of
 * LOOM_MALLOC_SMALL_RESERVE bytes between live blocks, so that such small blocks are
 * served from it and the large temporaries always from the top. Call it once after the
 * run's buffers are allocated, before the first step. Returns 1 if the reserve was made
 * (only after loom_malloc_keep_pages set the policy). */
int loom_malloc_reserve_small(void);

#endif
