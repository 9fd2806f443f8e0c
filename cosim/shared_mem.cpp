// DPI-C side of the rank memories in mapped files (cosim/shared_mem.py defines the layout and
// creates the files; this side maps them and reads the offsets from their headers). One
// simulator may map several memories (the DIMM-NMP top: one per rank); each open returns a
// handle that the other calls take.
//
// The NME's word port (cosim/nme/nme_top.sv) calls:
//   coda_mem_open(path, words, lanes)  once at time 0: map the file; a handle >= 0, or a
//                                      negative error code
//   coda_mem_read(h, addr, data)       data = word addr (16*lanes bits)
//   coda_mem_write(h, addr, data, mask)  lanes whose mask bit is set take data's element; the
//                                      word joins the dirty list the first time it is written
//   coda_mem_clear(h)                  zero the memory
// A DRAM device of the DIMM-NMP (coda_dram_device in cosim/dram/dram_top.sv, CODA_DRAM_SHM) calls:
//   coda_mem_open_bursts(path, burst_bytes, nidx)  map a memory whose header has a burst map
//                                      of nidx device indexes and bursts of burst_bytes
//   coda_mem_read_burst(h, idx, data)  data = the burst at device index idx (zeros where the
//                                      index holds no burst of the memory or past its end)
//   coda_mem_write_burst(h, idx, data, bytemask)  bytes whose mask bit is set; every word of
//                                      the memory with a byte written joins the dirty list;
//                                      a write to an index with no burst counts as a stray
// and both tops:
//   coda_mem_run_start(h)              empty the dirty list (a job starts)
//   coda_mem_ndirty(h)                 words in the dirty list
// Addresses of the word port are checked by the top (requests past the memory never get
// here). Elements are little-endian uint16 (the file's and the host's order; svBitVecVal
// words are 32-bit chunks of the vector, least significant first, so element j is 16-bit
// chunk j, byte k is byte k of either).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "svdpi.h"

namespace {

struct Header {          // cosim/shared_mem.py: _HEADER ("<8sIIIIQQQIIQ")
    char magic[8];
    uint32_t lanes, words, ndirty, nstray;
    uint64_t mem_off, map_off, list_off;
    uint32_t burst_words, nidx;
    uint64_t idx_off;
};
static_assert(sizeof(Header) == 64, "the header is 64 bytes (cosim/shared_mem.py)");

struct Mapping {
    Header *head = nullptr;
    uint16_t *mem = nullptr;
    uint8_t *map = nullptr;
    uint32_t *list = nullptr;
    int32_t *idx = nullptr;   // burst of each device index, -1 for none
    uint32_t lanes = 0;
};

std::vector<Mapping> g_maps;

int map_file(const char *path) {
    int fd = open(path, O_RDWR);
    if (fd < 0) { perror(path); return -1; }
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(Header)) {
        close(fd);
        return -2;
    }
    void *base = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) { perror("mmap"); return -3; }
    Header *h = static_cast<Header *>(base);
    if (std::memcmp(h->magic, "CODAMEM1", 8) != 0) return -4;
    if (h->list_off + 4ull * h->words > static_cast<uint64_t>(st.st_size)) return -6;
    if (h->idx_off + 4ull * h->nidx > static_cast<uint64_t>(st.st_size)) return -6;
    auto *bytes = static_cast<uint8_t *>(base);
    Mapping m;
    m.head = h;
    m.mem = reinterpret_cast<uint16_t *>(bytes + h->mem_off);
    m.map = bytes + h->map_off;
    m.list = reinterpret_cast<uint32_t *>(bytes + h->list_off);
    m.idx = reinterpret_cast<int32_t *>(bytes + h->idx_off);
    m.lanes = h->lanes;
    g_maps.push_back(m);
    return static_cast<int>(g_maps.size() - 1);
}

inline void mark(Mapping &m, uint32_t addr) {
    if (!m.map[addr]) {
        m.map[addr] = 1;
        m.list[m.head->ndirty++] = addr;
    }
}

}  // namespace

extern "C" int coda_mem_open(const char *path, int words, int lanes) {
    int h = map_file(path);
    if (h < 0) return h;
    const Header *head = g_maps[h].head;
    if (head->words != static_cast<uint32_t>(words) || head->lanes != static_cast<uint32_t>(lanes))
        return -5;
    return h;
}

extern "C" int coda_mem_open_bursts(const char *path, int burst_bytes, int nidx) {
    int h = map_file(path);
    if (h < 0) return h;
    const Header *head = g_maps[h].head;
    if (head->nidx != static_cast<uint32_t>(nidx) ||
        2ull * head->lanes * head->burst_words != static_cast<uint64_t>(burst_bytes))
        return -5;
    return h;
}

extern "C" void coda_mem_read(int h, int addr, svBitVecVal *data) {
    const Mapping &m = g_maps[h];
    const uint32_t chunks = (16 * m.lanes + 31) / 32;
    std::memset(data, 0, 4 * chunks);
    std::memcpy(data, m.mem + static_cast<size_t>(addr) * m.lanes, 2 * m.lanes);
}

extern "C" void coda_mem_write(int h, int addr, const svBitVecVal *data,
                               const svBitVecVal *mask) {
    Mapping &m = g_maps[h];
    uint16_t *word = m.mem + static_cast<size_t>(addr) * m.lanes;
    const auto *elems = reinterpret_cast<const uint16_t *>(data);
    for (uint32_t j = 0; j < m.lanes; ++j)
        if ((mask[j / 32] >> (j % 32)) & 1u) word[j] = elems[j];
    mark(m, static_cast<uint32_t>(addr));
}

extern "C" void coda_mem_read_burst(int h, int idx, svBitVecVal *data) {
    const Mapping &m = g_maps[h];
    const uint32_t bw = m.head->burst_words;
    std::memset(data, 0, 2 * m.lanes * bw);
    if (idx < 0 || static_cast<uint32_t>(idx) >= m.head->nidx || m.idx[idx] < 0) return;
    const uint64_t w0 = static_cast<uint64_t>(m.idx[idx]) * bw;
    if (w0 >= m.head->words) return;
    const uint64_t n = std::min<uint64_t>(bw, m.head->words - w0);
    std::memcpy(data, m.mem + w0 * m.lanes, 2 * m.lanes * n);
}

extern "C" void coda_mem_write_burst(int h, int idx, const svBitVecVal *data,
                                     const svBitVecVal *bytemask) {
    Mapping &m = g_maps[h];
    const uint32_t bw = m.head->burst_words, wb = 2 * m.lanes;
    if (idx < 0 || static_cast<uint32_t>(idx) >= m.head->nidx || m.idx[idx] < 0) {
        m.head->nstray++;
        return;
    }
    const uint64_t w0 = static_cast<uint64_t>(m.idx[idx]) * bw;
    const auto *src = reinterpret_cast<const uint8_t *>(data);
    auto *dst = reinterpret_cast<uint8_t *>(m.mem);
    for (uint32_t k = 0; k < bw && w0 + k < m.head->words; ++k) {
        bool any = false;
        for (uint32_t j = 0; j < wb; ++j) {
            const uint32_t b = k * wb + j;
            if ((bytemask[b / 32] >> (b % 32)) & 1u) {
                dst[(w0 + k) * wb + j] = src[b];
                any = true;
            }
        }
        if (any) mark(m, static_cast<uint32_t>(w0 + k));
    }
}

extern "C" void coda_mem_run_start(int h) {
    Mapping &m = g_maps[h];
    for (uint32_t i = 0; i < m.head->ndirty; ++i) m.map[m.list[i]] = 0;
    m.head->ndirty = 0;
    m.head->nstray = 0;
}

extern "C" int coda_mem_ndirty(int h) { return static_cast<int>(g_maps[h].head->ndirty); }

extern "C" void coda_mem_clear(int h) {
    const Mapping &m = g_maps[h];
    std::memset(m.mem, 0, static_cast<size_t>(2) * m.lanes * m.head->words);
}
