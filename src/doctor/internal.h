// Helpers the doctor's files share (not part of its interface, doctor/doctor.h).
#pragma once
#include <cstdint>
#include <string>

#include "doctor/doctor.h"

namespace tessera::doctor {

// "1.50 GiB".
std::string gib(uint64_t bytes);
// The first line of a file ("" when it cannot be read).
std::string read_line(const std::string& path);
// "node 1 (10.0.0.2)", or "node 1" before the node has an address.
std::string node_name(const NodeFacts& f);
// The interface of that name among the node's (nullptr when it has none).
const InterfaceFacts* find_interface(const NodeFacts& f, const std::string& name);

}  // namespace tessera::doctor
