// The `kolo_torch._C` extension module: ProcessGroupKolo as a torch.distributed process
// group class (constructed by the backend creator in kolo_torch/__init__.py) and the
// `kolo run` handshake that gives torch's env:// rendezvous its master address.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bridge.h"
#include "process_group.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "kolo's collectives as a torch.distributed process group (backend \"kolo\")";
  // The base classes (ProcessGroup, Store) are torch's: load their bindings first.
  py::module::import("torch.distributed");

  py::class_<kolo_torch::ProcessGroupKolo, c10d::ProcessGroup, c10::intrusive_ptr<kolo_torch::ProcessGroupKolo>>(
      m, "ProcessGroupKolo")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<kolo_torch::ProcessGroupKolo>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>(),
           "Joins `size` ranks through `store` (collective); every later operation is bounded by `timeout`.");

  m.def(
      "agree_torch_master",
      [](const std::string& storeAddress, const std::string& token, int rank, const std::string& key,
         std::chrono::milliseconds timeout) {
        return kolo_torch::agreeTorchMaster(storeAddress, token, rank, key, timeout);
      },
      py::arg("store"), py::arg("token"), py::arg("rank"), py::arg("key"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>(),
      "Under `kolo run`: the \"host:port\" where rank 0 hosts torch's TCPStore, agreed through the launcher's store.");
}
