#pragma once
// Whole-file reads and crash-safe whole-file writes, shared by the .npy and safetensors code.
//
// A checkpoint or data file must never be seen half-written: a job killed mid-save (or a full
// disk) would otherwise leave a truncated file where the last good one was. So writes go to a
// temporary file in the same directory (rename is atomic only within one file system), which is
// written, fsynced and then renamed over the target; the directory is fsynced last so the
// rename itself survives a power loss.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nanoddp::nn {

// The whole file as bytes. Throws nanoddp::Error naming the path and the system's reason.
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);

// Which file a write made: its device and inode. A caller that later acts on the file by its
// name (moves it into place) checks that the name still holds this file: another process may
// have put its own there since the write.
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  bool operator==(const FileIdentity&) const = default;
};

// Writes the concatenation of `chunks` to `path` atomically (see above), and says which file it
// made. On any failure the temporary file is removed, the old contents of `path` (if any) are
// untouched, and nanoddp::Error names the path, the failing step and the system's reason (e.g.
// "No space left on device", "Permission denied"). New files get mode 0666 minus the umask,
// like fopen.
FileIdentity write_file_atomically(const std::filesystem::path& path,
                                   std::span<const std::span<const std::byte>> chunks);

// Who is writing a write_file_atomically temporary: its name is ".<target>.tmp.<host>.<pid>.<k>"
// while it is written, and stays so when the writer is killed. A later writer may remove such a
// leftover only when it is from this host (a pid means nothing on another machine sharing the
// folder over the network) and that process is gone.
struct TemporaryWriter {
  std::string host;
  long pid = 0;
};
std::optional<TemporaryWriter> temporary_writer(const std::string& filename);
// Removes the temporaries in `dir` whose name starts with `prefix` (".step-") and whose writer,
// a process of this host, is gone: checkpoints' and traces' leftovers from killed writers. A live
// writer's, this process's and another host's are left alone.
void remove_stale_temporaries(const std::filesystem::path& dir, std::string_view prefix);
std::string this_host();  // gethostname(), or "localhost"

// At most the first `max_chars` characters of untrusted `text` (a file's header, a metadata
// value), with "... (N characters in all)" when cut, and its control characters escaped
// (escape_controls): an error message must stay readable and small however big the input is,
// and say nothing the file's author wrote as a line of its own.
std::string excerpt(std::string_view text, std::size_t max_chars = 200);

// `text` with its control characters written as escapes: \n, \r, \t, \xNN for the other C0
// bytes, DEL and any byte that is not part of well-formed UTF-8 (a lone 0x9b is CSI to a
// terminal not in UTF-8), \uNNNN for the C1 controls (U+0080-U+009F, which some terminals obey
// as ESC sequences), the line separators and the bidirectional overrides.
// A crafted file's metadata printed raw in an error recoloured and retitled the terminal, and
// its newline printed a line that read as the program's own ("nanoddp-train: all good").
// `keep_newlines`: for a whole message a program prints, whose own lines are meant.
std::string escape_controls(std::string_view text, bool keep_newlines = false);

// The first `max_bytes` bytes of the file (fewer when it is shorter), and its whole size: what a
// reader checks (magic bytes, header) before it trusts the size enough to read the rest.
struct FileHead {
  std::vector<std::byte> bytes;
  std::uint64_t file_size = 0;
};
FileHead read_file_head(const std::filesystem::path& path, std::size_t max_bytes);

// Reads exactly `size` bytes at `offset` into `out`. Throws nanoddp::Error naming the path
// when the file is shorter or the read fails.
void read_file_range(const std::filesystem::path& path, std::uint64_t offset, std::byte* out,
                     std::size_t size);

// A 64-bit hash of the whole file, streamed in 1 MiB blocks (memory stays bounded), at several
// GB/s: for checking that ranks read the same bytes, not against tampering. The value is only
// comparable between runs of the same nanoddp version. Throws nanoddp::Error naming the path.
std::uint64_t file_checksum(const std::filesystem::path& path);

// The element count of a shape read from a file (non-negative sizes, already validated).
// Throws nanoddp::Error when it does not fit 64 bits, unless a size is 0: then it is 0.
std::int64_t shape_numel_checked(std::span<const std::int64_t> shape);

}  // namespace nanoddp::nn
