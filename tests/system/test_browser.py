"""Notebook 00 run the way an attendee runs it: `python -m lab_utils jupyter` serves the
notebooks, headless Chromium (Debian's chromium and chromium-driver, driven by Selenium)
opens 00 in JupyterLab and runs every cell through the UI's Run menu, and the checklist
table renders in the page (fails first, n/a collapsed). A screenshot is kept in results/test-artifacts/."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from support.profiles import make_profile_data, show, write_profile

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "results" / "test-artifacts"


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def start_jupyter(cfg, notebooks: Path, settings: Path):
    # JupyterLab 4 renders only the cells in view by default; the test reads the page's
    # DOM, so it asks for every cell to be rendered (a user setting, in a private folder)
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(settings / "workspaces")}
    proc = subprocess.Popen([sys.executable, "-m", "lab_utils", "jupyter", "--config",
                             str(cfg.source), "--notebooks-dir", str(notebooks)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True, env=env)
    deadline, line = time.monotonic() + 60, ""
    while "open: " not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
    m = re.search(r"open: (\S+)", line)
    assert m, "python -m lab_utils jupyter printed no URL"
    base, token = m.group(1).split("/lab?token=")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the URL is printed before the server listens
        try:
            if httpx.get(f"{base}/api/status", params={"token": token}, timeout=5).is_success:
                break
        except httpx.TransportError:
            time.sleep(0.5)
    return proc, m.group(1)


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.fail("chromium and chromedriver are needed (tests/ensure_sysdeps.sh installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1100"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def test_notebook_00_runs_in_jupyterlab_in_a_browser(tmp_path, request):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    data = make_profile_data(str(tmp_path / "results"))
    data["jupyter"] = {"port": free_port("127.0.0.4"), "token_file": str(tmp_path / "token")}
    cfg = write_profile(tmp_path, data)
    notebooks = tmp_path / "notebooks"  # a copy: the UI may autosave outputs into it
    shutil.copytree(ROOT / "notebooks", notebooks)
    proc, url = start_jupyter(cfg, notebooks, tmp_path / "lab-settings")
    driver = None
    t0 = time.monotonic()
    try:
        driver = browser()
        driver.get(url.replace("/lab?", "/lab/tree/00_Environment_Setup.ipynb?"))
        wait = WebDriverWait(driver, 120)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".jp-Notebook .jp-Cell")))
        wait.until(ec.presence_of_element_located(  # the kernel is up: the status bar says
            (By.XPATH, "//*[contains(@class, 'jp-StatusBar')]//*[contains(text(), 'Idle')]")))
        time.sleep(2)  # and its connection settled
        wait.until(ec.element_to_be_clickable(
            (By.XPATH, "//div[contains(@class, 'lm-MenuBar-itemLabel') and text()='Run']"))).click()
        wait.until(ec.element_to_be_clickable(
            (By.XPATH, "//div[contains(@class, 'lm-Menu-itemLabel') and "
                       "text()='Run All Cells']"))).click()
        try:
            table = WebDriverWait(driver, 240).until(ec.presence_of_element_located(
                (By.XPATH, "//div[contains(@class, 'jp-OutputArea-output')]"
                           "//table[.//td[normalize-space()='python']]")))
        except Exception:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "jupyterlab-notebook-00-failed.png"))
            raise
        cells = [td.text for td in table.find_elements(By.TAG_NAME, "td")]
        assert "pass" in cells and "controller" in cells, cells[:20]
        assert any(c.endswith(" n/a") for c in cells), "the n/a results are not collapsed"
        WebDriverWait(driver, 120).until(lambda d: (cfg.results_dir / "environment.json").exists())
        driver.execute_script("arguments[0].scrollIntoView();", table)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "jupyterlab-notebook-00.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        show(request, f"[browser] notebook 00 ran in JupyterLab in {time.monotonic() - t0:.0f} s;"
                      f" screenshot {shot}")
    finally:
        if driver is not None:
            driver.quit()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
