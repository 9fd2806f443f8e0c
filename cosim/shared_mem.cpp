// DPI-C side of the NME's rank memory in a mapped file (cosim/shared_mem.py defines the
// layout and creates the file; this side maps it and reads the offsets from its header).
//
// cosim/nme_top.sv calls:
//   coda_mem_open(path, words, lanes)  once at time 0: map the file; 0 = ok, else an error code
//   coda_mem_read(addr, data)          data = word addr (16*lanes bits)
//   coda_mem_write(addr, data, mask)   lanes whose mask bit is set take data's element; the word
//                                      joins the dirty list the first time it is written
//   coda_mem_run_start()               empty the dirty list (a job starts)
//   coda_mem_ndirty()                  words in the dirty list
//   coda_mem_clear()                   zero the memory
// Addresses are checked by the top (requests past the memory never get here). Elements are
// little-endian uint16 (the file's and the host's order; svBitVecVal words are 32-bit chunks
// of the vector, least significant first, so element j is 16-bit chunk j of either).

#include <cstdint>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "svdpi.h"

namespace {

struct Header {          // cosim/shared_mem.py: _HEADER ("<8sIIIxxxxQQQ")
    char magic[8];
    uint32_t lanes, words, ndirty, pad;
    uint64_t mem_off, map_off, list_off;
};

struct Mapping {
    Header *head = nullptr;
    uint16_t *mem = nullptr;
    uint8_t *map = nullptr;
    uint32_t *list = nullptr;
    uint32_t lanes = 0;
} g;

}  // namespace

extern "C" int coda_mem_open(const char *path, int words, int lanes) {
    int fd = open(path, O_RDWR);
    if (fd < 0) { perror(path); return 1; }
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(Header)) {
        close(fd);
        return 2;
    }
    void *base = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) { perror("mmap"); return 3; }
    Header *h = static_cast<Header *>(base);
    if (std::memcmp(h->magic, "CODAMEM1", 8) != 0) return 4;
    if (h->words != static_cast<uint32_t>(words) || h->lanes != static_cast<uint32_t>(lanes))
        return 5;
    if (h->list_off + 4ull * h->words > static_cast<uint64_t>(st.st_size)) return 6;
    auto *bytes = static_cast<uint8_t *>(base);
    g.head = h;
    g.mem = reinterpret_cast<uint16_t *>(bytes + h->mem_off);
    g.map = bytes + h->map_off;
    g.list = reinterpret_cast<uint32_t *>(bytes + h->list_off);
    g.lanes = h->lanes;
    return 0;
}

extern "C" void coda_mem_read(int addr, svBitVecVal *data) {
    const uint32_t chunks = (16 * g.lanes + 31) / 32;
    std::memset(data, 0, 4 * chunks);
    std::memcpy(data, g.mem + static_cast<size_t>(addr) * g.lanes, 2 * g.lanes);
}

extern "C" void coda_mem_write(int addr, const svBitVecVal *data, const svBitVecVal *mask) {
    uint16_t *word = g.mem + static_cast<size_t>(addr) * g.lanes;
    const auto *elems = reinterpret_cast<const uint16_t *>(data);
    for (uint32_t j = 0; j < g.lanes; ++j)
        if ((mask[j / 32] >> (j % 32)) & 1u) word[j] = elems[j];
    if (!g.map[addr]) {
        g.map[addr] = 1;
        g.list[g.head->ndirty++] = static_cast<uint32_t>(addr);
    }
}

extern "C" void coda_mem_run_start() {
    for (uint32_t i = 0; i < g.head->ndirty; ++i) g.map[g.list[i]] = 0;
    g.head->ndirty = 0;
}

extern "C" int coda_mem_ndirty() { return static_cast<int>(g.head->ndirty); }

extern "C" void coda_mem_clear() {
    std::memset(g.mem, 0, static_cast<size_t>(2) * g.lanes * g.head->words);
}
