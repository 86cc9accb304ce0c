"""Package layout: the core lives in python_backend/zerocheck; clients/ and loadtests/ are its
subpackages zerocheck.clients and zerocheck.loadtests (metadata is in pyproject.toml)."""
from setuptools import find_packages, setup

package_dir = {"zerocheck": "python_backend/zerocheck", "zerocheck.clients": "clients",
               "zerocheck.loadtests": "loadtests"}
packages = find_packages("python_backend", include=["zerocheck*"])
for name, folder in list(package_dir.items())[1:]:
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
setup(packages=packages, package_dir=package_dir)
