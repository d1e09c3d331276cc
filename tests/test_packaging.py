"""The package builds without warnings and installs every shipped recipe (issue 24, item 15)."""
from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_recipe_folder_is_a_declared_package():
    packages = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['setuptools']['packages']
    folders = {f'zoo.recipes.configs.{p.name}' for p in (ROOT / 'recipes' / 'configs').iterdir() if p.is_dir()}
    assert folders <= set(packages), f'add to pyproject.toml packages: {sorted(folders - set(packages))}'


def test_every_python_package_is_declared():
    """A sub-package left out of the list is left out of the wheel (zoo.datasets.detection once was)."""
    packages = set(tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['setuptools']['packages'])
    roots = {'zoo': 'zoo', 'layers': 'zoo.layers', 'recipes': 'zoo.recipes', 'datasets': 'zoo.datasets',
             'eval': 'zoo.eval'}
    found = {'.'.join([name, *init.parent.relative_to(ROOT / folder).parts])
             for folder, name in roots.items() for init in (ROOT / folder).rglob('__init__.py')}
    assert found <= packages, f'add to pyproject.toml packages: {sorted(found - packages)}'


def test_the_wheel_builds_quietly_and_holds_the_recipes(tmp_path):
    proc = subprocess.run([sys.executable, '-m', 'pip', 'wheel', str(ROOT), '--no-deps', '--no-build-isolation',
                           '-w', str(tmp_path), '-v'], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    noise = [line for line in (proc.stdout + proc.stderr).splitlines()
             if 'Warning' in line and ('setuptools' in line.lower() or 'BuildBackend' in line)]
    assert not noise, noise[:5]
    [wheel] = tmp_path.glob('zoo-*.whl')
    shipped = {str(p.relative_to(ROOT / 'recipes' / 'configs')) for p in (ROOT / 'recipes' / 'configs').rglob('*.yaml')}
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    inside = {n.split('zoo/recipes/configs/', 1)[1] for n in names if 'zoo/recipes/configs/' in n}
    assert shipped <= inside
    studies = [n for n in names if n.split('/')[0] in ('benchmarks', 'experiments') or '/experiments/' in n]
    assert not studies, f'the studies are not part of the package: {studies[:5]}'
