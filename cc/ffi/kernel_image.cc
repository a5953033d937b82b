#include "ffi/kernel_image.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>

#include <cuda_runtime_api.h>

namespace jax_cluster {
namespace {

// Layouts read here: the ELF64 headers, and nvcc's fatbinary container (a
// header, then entries that each carry one cubin or PTX for one SM).
constexpr uint32_t kFatbinMagic = 0xBA55ED50u;
constexpr uint16_t kFatbinElfEntry = 2;
constexpr uint32_t kSymtab = 2;   // SHT_SYMTAB
constexpr uint32_t kNoBits = 8;   // SHT_NOBITS: no bytes in the file
constexpr uint8_t kFunction = 2;  // STT_FUNC

template <class T>
bool read_at(const std::string& bytes, size_t offset, T* out) {
  if (offset > bytes.size() || bytes.size() - offset < sizeof(T)) return false;
  std::memcpy(out, bytes.data() + offset, sizeof(T));
  return true;
}

bool is_elf(const std::string& bytes, size_t at, size_t size) {
  return size >= 4 && std::memcmp(bytes.data() + at,
                                  "\x7f"
                                  "ELF",
                                  4) == 0;
}

struct Section {
  uint32_t name = 0, type = 0, link = 0;
  uint64_t offset = 0, size = 0;
};

// The section headers of the ELF64 image in bytes[begin, begin + size).
bool sections(const std::string& bytes, size_t begin, size_t size, std::vector<Section>* out,
              uint16_t* names_index) {
  uint64_t table = 0;
  uint16_t entry = 0, count = 0;
  if (size < 64 || !is_elf(bytes, begin, size) || bytes[begin + 4] != 2)
    return false;  // not a 64-bit ELF
  if (!read_at(bytes, begin + 0x28, &table) || !read_at(bytes, begin + 0x3A, &entry) ||
      !read_at(bytes, begin + 0x3C, &count) || !read_at(bytes, begin + 0x3E, names_index))
    return false;
  for (uint16_t i = 0; i < count; ++i) {
    const size_t at = begin + table + size_t(i) * entry;
    Section s;
    if (!read_at(bytes, at, &s.name) || !read_at(bytes, at + 4, &s.type) ||
        !read_at(bytes, at + 24, &s.offset) || !read_at(bytes, at + 32, &s.size) ||
        !read_at(bytes, at + 40, &s.link))
      return false;
    if (s.type != kNoBits && s.offset + s.size > size) return false;
    out->push_back(s);
  }
  return *names_index < out->size();
}

std::string c_string(const std::string& bytes, size_t at, size_t end) {
  size_t stop = bytes.find('\0', at);
  return bytes.substr(at, (stop == std::string::npos ? end : std::min(stop, end)) - at);
}

struct Cubin {
  int sm;
  size_t begin, size;
  std::vector<std::string> functions;
};

struct EmbeddedCubins {
  std::string file;  // this shared object's bytes; the cubins point into it
  std::vector<Cubin> cubins;
  std::string error;
};

std::vector<std::string> functions_of(const std::string& bytes, size_t begin, size_t size) {
  std::vector<Section> heads;
  uint16_t names = 0;
  std::vector<std::string> out;
  if (!sections(bytes, begin, size, &heads, &names)) return out;
  for (const Section& s : heads) {
    if (s.type != kSymtab || s.link >= heads.size()) continue;
    const Section& strings = heads[s.link];
    for (uint64_t at = s.offset; at + 24 <= s.offset + s.size; at += 24) {
      uint32_t name = 0;
      uint8_t info = 0;
      read_at(bytes, begin + at, &name);
      read_at(bytes, begin + at + 4, &info);
      if ((info & 0xf) != kFunction || name >= strings.size) continue;
      out.push_back(
          c_string(bytes, begin + strings.offset + name, begin + strings.offset + strings.size));
    }
  }
  return out;
}

std::unique_ptr<EmbeddedCubins> load() {
  auto out = std::make_unique<EmbeddedCubins>();
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&find_kernel_image), &info) == 0 ||
      info.dli_fname == nullptr) {
    out->error = "cannot find the file of the jax_cluster extension";
    return out;
  }
  std::ifstream in(info.dli_fname, std::ios::binary);
  out->file.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  const std::string& bytes = out->file;
  std::vector<Section> heads;
  uint16_t names = 0;
  if (!sections(bytes, 0, bytes.size(), &heads, &names)) {
    out->error = std::string("cannot read the ELF headers of ") + info.dli_fname;
    return out;
  }
  const Section& strings = heads[names];
  const Section* fatbin = nullptr;
  for (const Section& s : heads)
    if (c_string(bytes, strings.offset + s.name, strings.offset + strings.size) == ".nv_fatbin")
      fatbin = &s;
  if (fatbin == nullptr) {
    out->error = "the extension has no .nv_fatbin section";
    return out;
  }
  size_t at = fatbin->offset;
  const size_t end = fatbin->offset + fatbin->size;
  while (at + 16 <= end) {
    uint32_t magic = 0;
    uint16_t header = 0;
    uint64_t body = 0;
    read_at(bytes, at, &magic);
    read_at(bytes, at + 6, &header);
    read_at(bytes, at + 8, &body);
    if (magic != kFatbinMagic) break;  // padding after the last container
    size_t entry = at + header;
    const size_t stop = std::min<size_t>(end, at + header + body);
    while (entry + 32 <= stop) {
      uint16_t kind = 0;
      uint32_t entry_header = 0, sm = 0;
      uint64_t payload = 0;
      read_at(bytes, entry, &kind);
      read_at(bytes, entry + 4, &entry_header);
      read_at(bytes, entry + 8, &payload);
      read_at(bytes, entry + 28, &sm);
      const size_t begin = entry + entry_header;
      if (begin + payload > stop) break;
      // a compressed cubin does not start with the ELF magic: skipped
      if (kind == kFatbinElfEntry && is_elf(bytes, begin, payload))
        out->cubins.push_back(
            {int(sm), begin, size_t(payload), functions_of(bytes, begin, payload)});
      entry = begin + payload;
    }
    at = (at + header + body + 7) / 8 * 8;
  }
  if (out->cubins.empty()) out->error = "the extension's .nv_fatbin holds no uncompressed cubin";
  return out;
}

const EmbeddedCubins& embedded() {
  static const std::unique_ptr<EmbeddedCubins> cubins = load();
  return *cubins;
}

}  // namespace

const KernelImage* find_kernel_image(const void* kernel, int sm, std::string* why) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, std::unique_ptr<KernelImage>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(kernel, sm);
  if (auto it = cache.find(key); it != cache.end()) return it->second.get();
  const EmbeddedCubins& all = embedded();
  if (!all.error.empty()) {
    *why = all.error;
    return nullptr;
  }
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) != cudaSuccess || name == nullptr) {
    cudaGetLastError();
    *why = "cudaFuncGetName does not know the kernel";
    return nullptr;
  }
  for (const Cubin& c : all.cubins) {
    if (c.sm != sm) continue;
    for (const std::string& f : c.functions) {
      if (f != name) continue;
      auto image = std::make_unique<KernelImage>();
      image->name = f;
      image->cubin = all.file.data() + c.begin;
      image->cubin_bytes = c.size;
      return (cache[key] = std::move(image)).get();
    }
  }
  *why = std::string("no embedded cubin for SM ") + std::to_string(sm) + " defines " + name;
  return nullptr;
}

std::vector<CubinSummary> embedded_cubins(std::string* why) {
  const EmbeddedCubins& all = embedded();
  *why = all.error;
  std::vector<CubinSummary> out;
  for (const Cubin& c : all.cubins) out.push_back({c.sm, c.functions});
  return out;
}

}  // namespace jax_cluster
