import os
import re
import shutil

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import load

required_conan_version = ">=2.0"


class KvfuseConan(ConanFile):
    """Header-only kvfuse. Packaged through kvfuse's own `cmake --install`, so CMake consumers get the
    project's kvfuseConfig.cmake (targets kvfuse::kvfuse and, with cuda=True, kvfuse::cuda), exactly as
    from a plain install; CMakeDeps generates nothing for kvfuse itself (cmake_find_mode "none")."""

    name = "kvfuse"
    description = "KV-cache scheduling and fusion algorithms for LLM serving engines (header-only C++20)"
    topics = ("llm", "kv-cache", "inference", "cuda", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"cuda": [True, False]}
    default_options = {"cuda": False}
    exports_sources = "CMakeLists.txt", "cmake/*", "include/*", "kernels/*"
    no_copy_source = True

    def set_version(self):
        # The version is defined once: the KVFUSE_VERSION_* macros of include/kvfuse/core/config.hpp.
        config = load(self, os.path.join(self.recipe_folder, "include", "kvfuse", "core", "config.hpp"))
        parts = []
        for part in ("MAJOR", "MINOR", "PATCH"):
            match = re.search(r"^#define KVFUSE_VERSION_%s (\d+)$" % part, config, re.MULTILINE)
            if not match:
                raise ConanException("kvfuse: no `#define KVFUSE_VERSION_%s N` in include/kvfuse/core/config.hpp" % part)
            parts.append(match.group(1))
        self.version = ".".join(parts)

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # Public headers include fmt; kvfuse::cpu also Eigen and PCRE2: consumers compile against them.
        self.requires("fmt/9.1.0", transitive_headers=True, transitive_libs=True)
        self.requires("xxhash/0.8.1", transitive_headers=True, transitive_libs=True)
        self.requires("eigen/3.4.0", transitive_headers=True)
        self.requires("pcre2/10.42", transitive_headers=True, transitive_libs=True)

    def package_id(self):
        # Headers do not depend on compiler, OS or build type; the cuda option stays in the id because it
        # changes what is installed (kvfuse::cuda, kernel headers).
        self.info.settings.clear()

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def validate_build(self):
        if self.options.cuda and not (os.environ.get("CUDACXX") or shutil.which("nvcc")):
            raise ConanInvalidConfiguration("kvfuse/*:cuda=True needs the CUDA toolkit: nvcc on PATH or CUDACXX")

    def generate(self):
        tc = CMakeToolchain(self)
        # Nothing is compiled here, and kvfuse's targets carry cxx_std_20 themselves. A toolchain-wide
        # CMAKE_CXX_STANDARD would also become the CUDA dialect, which CMake 3.25 cannot pass to nvcc
        # (it knows nvcc flags up to C++17), so enable_language(CUDA) would fail with cuda=True.
        tc.blocks.remove("cppstd")
        tc.cache_variables["KVFUSE_CUDA"] = bool(self.options.cuda)
        # The Redis tier (hiredis) and the codecs (lz4, zstd) are not packaged: build kvfuse from source for them.
        tc.cache_variables["KVFUSE_REDIS"] = False
        tc.cache_variables["KVFUSE_CODECS"] = False
        tc.cache_variables["KVFUSE_BUILD_TESTS"] = False
        tc.cache_variables["KVFUSE_BUILD_EXAMPLES"] = False
        tc.cache_variables["KVFUSE_BUILD_BENCH"] = False
        tc.cache_variables["KVFUSE_INSTALL"] = True
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        cmake = CMake(self)
        cmake.install()

    def package_info(self):
        # CMake: CMakeDeps writes nothing for kvfuse; consumers load kvfuse's installed kvfuseConfig.cmake,
        # whose folder is a builddir, which CMakeToolchain puts on CMAKE_PREFIX_PATH. That config calls
        # find_dependency(fmt) (and find_dependency(CUDAToolkit) with cuda=True) itself.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.set_property("cmake_file_name", "kvfuse")

        # Components, for every other generator (PkgConfigDeps, MSBuildDeps, ...). With components
        # declared, only theirs count, so the builddir sits on the core component.
        core = self.cpp_info.components["kvfuse"]
        core.set_property("cmake_target_name", "kvfuse::kvfuse")
        core.requires = ["fmt::fmt", "xxhash::xxhash"]
        core.builddirs = [os.path.join("lib", "cmake", "kvfuse")]
        core.bindirs = []
        core.libdirs = []
        # kvfuse::cpu: GGUF models, tokenizer and the Eigen reference backend.
        cpu = self.cpp_info.components["cpu"]
        cpu.set_property("cmake_target_name", "kvfuse::cpu")
        cpu.requires = ["kvfuse", "eigen::eigen", "pcre2::pcre2"]
        cpu.system_libs = ["pthread"]
        cpu.bindirs = []
        cpu.libdirs = []
        if self.options.cuda:
            # The CUDA toolkit is not a Conan package: it comes from the system (nvcc, libcudart).
            cuda = self.cpp_info.components["cuda"]
            cuda.set_property("cmake_target_name", "kvfuse::cuda")
            cuda.requires = ["kvfuse"]
            cuda.system_libs = ["cudart"]
            cuda.bindirs = []
            cuda.libdirs = []
